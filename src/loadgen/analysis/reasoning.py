"""Reasoning models: thinking tokens before the answer, and when the answer began. Pure, no I/O.

A reasoning model streams its thinking first (chat: `reasoning_content` deltas; Responses:
`response.reasoning_text.delta`; Messages: `thinking_delta`), then the answer. TTFT
(`metrics.ttft_ms`) is the first token of any kind; what a user waits for is the first answer token:

- time to first answer token, `ttfa_ms` = first answer content event − start (streaming). Without
  reasoning it equals TTFT; a stream that reached its output cap while still thinking has none.
- reasoning tokens = the API's own count (`usage.completion_tokens_details.reasoning_tokens`,
  `usage.output_tokens_details.reasoning_tokens`) when given, else the reasoning events counted
  (llama-server streams one token per event); answer tokens = output tokens − reasoning tokens.
- reasoning share of a level = Σ reasoning tokens / Σ output tokens of its successful requests.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..core.records import RequestRecord


def ttfa_ms(r: RequestRecord) -> float | None:
    """Time to the first answer token, ms (see the module docstring); None when unknown."""
    if not r.ok or r.first_token_ns is None:
        return None
    first = r.first_answer_ns if r.reasoning_tokens else r.first_token_ns
    return None if first is None else (first - r.start_ns) / 1e6


def answer_tokens(r: RequestRecord) -> int | None:
    """Output tokens that were not thinking; None when the output count is unknown."""
    out = r.output_tokens
    return None if out is None else max(0, out - (r.reasoning_tokens or 0))


def reasoning_share(records: Iterable[RequestRecord]) -> float | None:
    """Σ reasoning tokens / Σ output tokens over the successful records; None without output."""
    reasoning = output = 0
    for r in records:
        if r.ok and r.output_tokens:
            output += r.output_tokens
            reasoning += r.reasoning_tokens or 0
    return reasoning / output if output else None
