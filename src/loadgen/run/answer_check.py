"""The correctness check under load for the embeddings and rerank APIs (backends/embeddings.py).

Before a target's first level, `reference_pass` sends each of the check texts
(analysis/embedding_check.py `CHECK_TEXTS`) alone, one request after another, and keeps the answers
in memory. `CheckedBackend` then makes every `CHECK_EVERY`th request of a level (request seq 0,
CHECK_EVERY, ...) a check request: `items` of the check texts, unsalted, the same text as the
reference's. Its answer is compared as it comes back (`parse_at`, which the engine calls with the
request's seq) and a mismatch is the request's failure (`embedding_mismatch`, `rank_mismatch`),
named with the input. The other requests are the level's salted load, parsed as the backend parses them.

The reference pass is also where a server that does not serve the API says so (llama-server
without `--embeddings` answers 501 "This server does not support embeddings. Start it with
`--embeddings`"): its answer is the target's error, before any level.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from ..analysis.embedding_check import CHECK_TEXTS, ranking_mismatch, vectors_mismatch
from ..client.backends.common import snippet
from ..client.backends.embeddings import AnswerBackend
from ..client.sse import EventReader
from ..client.transport import Transport, TransportError
from ..core import records
from ..core.records import ServerOutcome

# Every this-many-th request of a level is a check request.
CHECK_EVERY = 4


class ReferenceFailed(Exception):
    """The reference pass got no usable answer: the message (one line) says what the server said."""


@dataclass(frozen=True, slots=True)
class Reference:
    """Each check text's answer alone, by check index: a vector (embeddings) or a score (rerank)."""

    answers: tuple[Any, ...]
    texts: tuple[str, ...] = CHECK_TEXTS


async def reference_pass(transport: Transport, backend: AnswerBackend,
                         texts: tuple[str, ...] = CHECK_TEXTS) -> Reference:
    """Each text answered alone, one request at a time; ReferenceFailed on the first that is not."""
    answers = []
    for text in texts:
        try:
            response = await transport.request(backend.method, backend.path, backend.body([text]))
        except TransportError as exc:
            raise ReferenceFailed(f"{backend.method} {backend.path}: {exc.message}") from None
        outcome = _one_answer(backend, response.status, response.body)
        if isinstance(outcome, ServerOutcome):
            raise ReferenceFailed(f"{backend.method} {backend.path} answered {outcome.error_kind}: "
                                  f"{outcome.error_message}")
        answers.append(outcome)
    return Reference(tuple(answers), texts)


def _one_answer(backend: AnswerBackend, status: int, body: bytes) -> Any:
    """The one answer of a single-text body, or the failed outcome."""
    parsed = backend.parse_count(status, body, 1)
    if parsed.error_kind is not None:
        return parsed
    try:
        return backend.answers(body)[0]
    except (msgspec.DecodeError, ValueError, IndexError) as exc:
        return ServerOutcome(error_kind=records.INVALID_JSON, error_message=f"unreadable answer ({exc}): {snippet(body)}")


class CheckedBackend:
    """`inner`'s requests, every CHECK_EVERY-th one a check request judged against `reference`."""

    method = "POST"
    stream = False

    def __init__(self, inner: AnswerBackend, reference: Reference, every: int = CHECK_EVERY):
        self.inner, self.reference, self.every = inner, reference, every
        self.name, self.path = inner.name, inner.path
        self.parse = inner.parse

    def inputs(self, index: int) -> list[int]:
        """The check indexes a check request (number `index`) carries: the next `items` in turn."""
        n, items = len(self.reference.texts), self.inner.items
        first = index // self.every * items
        return [(first + i) % n for i in range(items)]

    def build(self, salt: str, index: int = 0) -> bytes:
        if index % self.every:
            return self.inner.build(salt, index)
        return self.inner.body([self.reference.texts[i] for i in self.inputs(index)])

    def parse_at(self, seq: int, status: int, body: bytes) -> ServerOutcome:
        """Request `seq`'s outcome: the inner parse, and for a check request the check's verdict."""
        outcome = self.inner.parse(status, body)
        if seq % self.every or outcome.error_kind is not None:
            return outcome
        inputs = self.inputs(seq)
        try:
            got = self.inner.answers(body)
        except (msgspec.DecodeError, ValueError, IndexError) as exc:
            return ServerOutcome(error_kind=records.INVALID_JSON, error_message=f"unreadable answer ({exc})")
        ref, texts = self.reference.answers, self.reference.texts
        if self.inner.rerank:
            message, kind = ranking_mismatch(ref, got, inputs, texts), records.RANK_MISMATCH
        else:
            message, kind = vectors_mismatch(ref, got, inputs, texts), records.EMBEDDING_MISMATCH
        if message is None:
            return outcome
        return msgspec.structs.replace(outcome, error_kind=kind, error_message=message)

    def event_reader(self) -> EventReader:
        return self.inner.event_reader()  # refuses: these APIs do not stream
