"""The correctness check under load of the APIs that answer without generating (embeddings, rerank).

A fixed set of check texts is answered one at a time before the first level (the reference), and
again inside requests of every level, at its concurrency. An answer under load must match its
reference: an embedding points the same way (cosine ≥ `COSINE_BOUND`), a rerank request ranks its
documents in the reference's order and gives each the reference's score (within
`SCORE_TOLERANCE`). The first input that does not is named in the failure's message: its check
index and the start of its text. Pure functions; the caller keeps the reference in memory
(run/answer_check.py), so no vector is ever written to a record.

Why 0.999: the same text through the same weights differs only by float rounding, which depends on
how the server batched it with other requests (the order of a sum, the kernel chosen for a batch
size). On llama.cpp's CPU backend that moves a 576-wide mean-pooled vector's cosine below 1 by
less than 1e-5; a corrupted vector (another request's, a half-written one, a wrong slot's) falls
far below 0.99. 0.999 leaves two orders of magnitude for rounding and still catches a perturbation
of 4% of the vector's length. Scores (rerank logits) get an absolute 1e-3 for the same reason; a
pair of documents whose reference scores are within that tolerance may swap without a mismatch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

COSINE_BOUND = 0.999
SCORE_TOLERANCE = 1e-3
# Characters of an input's text its failure message quotes.
QUOTED_CHARS = 40

# The check's texts: fixed, of varied lengths, sent identically every time (never salted).
CHECK_TEXTS = (
    "The server answers many requests at once by batching their tokens together.",
    "Rain fell on the harbour all night, and by morning the boats had drifted.",
    "A prime number has exactly two divisors: one and itself.",
    "Latency is the time from sending a request to receiving its whole answer; throughput is how many "
    "answers arrive per second when many requests are in flight.",
    "Bread rises because yeast turns sugar into carbon dioxide.",
    "The committee postponed its vote until the spring session.",
    "short text",
    "An embedding maps a text to a vector, so that texts with similar meanings lie close together and a "
    "search can rank documents by how near they are to a query's vector.",
)


def text_figures(requests_ok: int, input_tokens: int, wall_s: float, items: int) -> dict[str, float | int]:
    """A level's figures of these APIs: texts answered (every successful request answered exactly
    `items` texts, its backend refuses any other count), texts/s and prompt tokens/s over its wall
    (0 for a level without a wall)."""
    texts = requests_ok * items
    return {"texts": texts, "texts_per_s": texts / wall_s if wall_s > 0 else 0.0,
            "input_tok_s": input_tokens / wall_s if wall_s > 0 else 0.0}


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """a·b / (|a| |b|); 0 when either vector is all zeros (or their lengths differ: no direction to share)."""
    if len(a) != len(b):
        return 0.0
    na, nb = math.sqrt(math.fsum(x * x for x in a)), math.sqrt(math.fsum(y * y for y in b))
    if na == 0.0 or nb == 0.0:
        return 1.0 if na == nb else 0.0
    return math.fsum(x * y for x, y in zip(a, b)) / (na * nb)


def named(index: int, text: str) -> str:
    """How a message names an input: its check index and the start of its text."""
    start = text if len(text) <= QUOTED_CHARS else text[:QUOTED_CHARS] + "…"
    return f"input {index} ({start!r})"


def vectors_mismatch(reference: Sequence[Sequence[float]], got: Sequence[Sequence[float]],
                     inputs: Sequence[int], texts: Sequence[str], bound: float = COSINE_BOUND) -> str | None:
    """None when every answered vector `got[i]` points as its input's reference does
    (`reference[inputs[i]]`, cosine ≥ bound); else one line naming the first input that does not."""
    for vector, index in zip(got, inputs):
        c = cosine(reference[index], vector)
        if not c >= bound:  # a NaN fails too
            return (f"{named(index, texts[index])}: cosine {c:.6f} under load with its embedding answered "
                    f"alone (bound {bound})")
    return None


def ranking_mismatch(reference: Sequence[float], got: Sequence[float], inputs: Sequence[int],
                     texts: Sequence[str], tolerance: float = SCORE_TOLERANCE) -> str | None:
    """None when the documents of a rerank request (`inputs`, scored `got`) keep their reference
    scores (`reference[inputs[i]]`, each scored alone) within `tolerance`, and so their order;
    else one line naming the first input out of place: one ranked above a document whose
    reference score is higher by more than the tolerance, else one whose score moved."""
    refs = [reference[i] for i in inputs]
    for a in range(len(inputs)):
        for b in range(len(inputs)):
            if refs[a] > refs[b] + tolerance and not got[a] > got[b]:
                return (f"{named(inputs[b], texts[inputs[b]])}: ranked above or level with "
                        f"{named(inputs[a], texts[inputs[a]])} under load, below it alone "
                        f"(scores {got[b]:.4f} ≥ {got[a]:.4f}; alone {refs[b]:.4f} < {refs[a]:.4f})")
    for score, ref, index in zip(got, refs, inputs):
        if not abs(score - ref) <= tolerance:
            return (f"{named(index, texts[index])}: relevance score {score:.6f} under load, {ref:.6f} "
                    f"alone (tolerance {tolerance})")
    return None
