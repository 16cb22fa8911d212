"""The APIs that answer without generating: `POST /v1/embeddings` and `POST /v1/rerank`.

Embeddings (OpenAI's shape): `{"model", "input": [texts]}` → `data[i].embedding`, `usage.prompt_tokens`.
Rerank (llama-server's, as Jina and Cohere spell it): `{"model", "query", "documents": [texts]}` →
`results[{index, relevance_score}]`, `usage`. A request carries `params.items` texts, each salted
as a generation prompt is ("[<salt>] " in front; "[<salt>-<i>] " for item i of several), so the
server never answers from a cache. Neither streams nor generates: a record's output tokens are 0,
its prompt tokens the server's `usage.prompt_tokens`.

`parse` reads counts only (msgspec skips the vectors); `answers` decodes the vectors or scores, by
input index, for the correctness check under load (run/answer_check.py), which runs on few requests.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ...core import records
from ...core.records import ServerOutcome, Usage
from . import GenerationParams
from .common import error_outcome, undecodable

# The query every rerank request asks (salted per request), and the check's (sent as is).
RERANK_QUERY = "Which of these passages says most about how a server answers many requests at once?"


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    total_tokens: int | None = None


class _Indexed(msgspec.Struct):
    index: int | None = None


class _Counts(msgspec.Struct):
    """A response's parts `parse` reads: one entry per input (`data` or `results`), the usage, an error."""

    data: list[_Indexed] | None = None
    results: list[_Indexed] | None = None
    usage: _Usage | None = None
    error: Any = None


class _Embedding(msgspec.Struct):
    index: int = 0
    embedding: list[float] = []


class _Score(msgspec.Struct):
    index: int = 0
    relevance_score: float = 0.0


class _Vectors(msgspec.Struct):
    data: list[_Embedding] = []


class _Scores(msgspec.Struct):
    results: list[_Score] = []


_decode = msgspec.json.Decoder(_Counts).decode
_decode_vectors = msgspec.json.Decoder(_Vectors).decode
_decode_scores = msgspec.json.Decoder(_Scores).decode


def salted(salt: str, text: str, item: int, items: int) -> str:
    """A text as sent: the salt in front, with the item's number when a request carries several."""
    return f"[{salt}] {text}" if items == 1 else f"[{salt}-{item}] {text}"


class AnswerBackend:
    """Embeddings (`rerank` False) or rerank requests of `params.items` texts each."""

    method = "POST"
    stream = False

    def __init__(self, params: GenerationParams, *, rerank: bool, model: str | None = None):
        self.rerank = rerank
        self.name = "rerank" if rerank else "embeddings"
        self.path = "/v1/rerank" if rerank else "/v1/embeddings"
        self.items = params.items
        self._texts = params.prompt_list
        self._model = {"model": model} if model is not None else {}

    def build(self, salt: str, index: int = 0) -> bytes:
        n, items = len(self._texts), self.items
        texts = [salted(salt, self._texts[(index * items + i) % n], i, items) for i in range(items)]
        return self.body(texts, f"[{salt}] {RERANK_QUERY}")

    def body(self, texts: list[str], query: str = RERANK_QUERY) -> bytes:
        """A request for exactly these texts (the check's are sent unsalted)."""
        if self.rerank:
            return msgspec.json.encode({**self._model, "query": query, "documents": texts})
        return msgspec.json.encode({**self._model, "input": texts})

    def parse(self, status: int, body: bytes) -> ServerOutcome:
        return self.parse_count(status, body, self.items)

    def parse_count(self, status: int, body: bytes, items: int) -> ServerOutcome:
        """`parse` of a body that answers `items` texts."""
        try:
            data = _decode(body)
        except msgspec.DecodeError as exc:
            return undecodable(status, body, exc)
        if status >= 400 or data.error is not None:
            return error_outcome(status, body, data.error)
        answers = data.results if self.rerank else data.data
        key = "results" if self.rerank else "data"
        if answers is None:
            return ServerOutcome(error_kind=records.INVALID_JSON, error_message=f"response has no `{key}`")
        if len(answers) != items:
            return ServerOutcome(error_kind=records.INVALID_JSON,
                                 error_message=f"{len(answers)} answers in `{key}` for {items} texts")
        u = data.usage
        prompt = u.prompt_tokens if u is not None else None
        usage = Usage(prompt, 0, u.total_tokens if u is not None and u.total_tokens is not None else prompt)
        return ServerOutcome(tokens_predicted=0, usage=usage)

    def answers(self, body: bytes) -> list[Any]:
        """The vectors (embeddings) or relevance scores (rerank) of a served body, by input index;
        msgspec.DecodeError (or ValueError) for a body of another shape."""
        if self.rerank:
            scores = _decode_scores(body).results
            out: list[Any] = [None] * len(scores)
            for s in scores:
                out[s.index] = s.relevance_score
            return out
        vectors = _decode_vectors(body).data
        out = [None] * len(vectors)
        for v in vectors:
            out[v.index] = v.embedding
        return out

    def event_reader(self) -> Any:
        raise ValueError(f"the {self.name} API does not stream")
