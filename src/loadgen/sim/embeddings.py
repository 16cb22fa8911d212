"""The simulator's `POST /v1/embeddings` and `POST /v1/rerank`, as llama-server answers them.

Served only when the simulator is started with embeddings (rerank) on, as llama-server's
`--embeddings` (`--reranking`); otherwise the route answers llama-server's 501. A text's vector is
deterministic: a unit vector drawn from a generator seeded with the text's hash, so the same text
always gets the same vector, whatever the load (the correctness check under load passes). A text
costs its tokens at the profile's `embed_tok_s` (default: its prefill rate), in one of the
server's slots; the prompt tokens count in `llamacpp:prompt_tokens_total` as llama-server counts them.
"""

from __future__ import annotations

import asyncio
import hashlib
import random

from .metrics import ServerMetrics
from .profile import Profile
from .tokenizer import pieces

# Width of a simulated embedding.
DIMENSIONS = 64
NOT_SUPPORTED = {
    "embeddings": "This server does not support embeddings. Start it with `--embeddings`",
    "rerank": "This server does not support reranking. Start it with `--reranking`",
}


class InvalidInput(ValueError):
    """A body without the texts the endpoint needs: the message is the 400's."""


def vector(text: str) -> list[float]:
    """The text's unit vector: the same text, the same vector."""
    rng = random.Random(hashlib.sha256(text.encode()).digest())
    v = [rng.gauss(0.0, 1.0) for _ in range(DIMENSIONS)]
    norm = sum(x * x for x in v) ** 0.5
    return [x / norm for x in v]


def relevance(query: str, document: str) -> float:
    """A document's score for a query: the dot product of their vectors (deterministic)."""
    return sum(a * b for a, b in zip(vector(query), vector(document)))


def texts_of(body: object, rerank: bool) -> tuple[str, list[str]]:
    """(query, texts) of a request body (query "" for embeddings); InvalidInput when it has none."""
    if not isinstance(body, dict):
        raise InvalidInput("the body is not a JSON object")
    key = "documents" if rerank else "input"
    texts = body.get(key, body.get("content") if not rerank else None)
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise InvalidInput(f"\"{key}\" must be a non-empty string or list of strings")
    query = body.get("query", "") if rerank else ""
    if rerank and not isinstance(query, str):
        raise InvalidInput("\"query\" must be a string")
    return query, texts


class Embedder:
    """Answers embedding and rerank requests in `slots` parallel slots at the profile's cost."""

    def __init__(self, profile: Profile, slots: int, time_scale: float, metrics: ServerMetrics):
        self.profile, self.time_scale, self.metrics = profile, time_scale, metrics
        self._slots = asyncio.Semaphore(slots)

    async def _compute(self, tokens: int) -> None:
        ms = self.profile.embed_ms(tokens)
        async with self._slots:
            await asyncio.sleep(ms * self.time_scale / 1e3)
        self.metrics.on_decode(1, tokens, ms * self.time_scale, tokens)

    async def embeddings(self, texts: list[str], model: str) -> dict[str, object]:
        counts = [len(pieces(t)) for t in texts]
        await asyncio.gather(*(self._compute(n) for n in counts))
        total = sum(counts)
        return {"model": model, "object": "list", "usage": {"prompt_tokens": total, "total_tokens": total},
                "data": [{"embedding": vector(t), "index": i, "object": "embedding"} for i, t in enumerate(texts)]}

    async def rerank(self, query: str, documents: list[str], model: str) -> dict[str, object]:
        counts = [len(pieces(query)) + len(pieces(d)) for d in documents]
        await asyncio.gather(*(self._compute(n) for n in counts))
        total = sum(counts)
        results = [{"index": i, "relevance_score": relevance(query, d)} for i, d in enumerate(documents)]
        return {"model": model, "object": "list", "usage": {"prompt_tokens": total, "total_tokens": total},
                "results": results}
