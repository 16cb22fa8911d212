"""Answers cut short: by the server's context, or (under --ignore-eos) for any other reason.

A request asks for N tokens (its `n_predict_target`, else the run's `--n-predict`: llama-server's
`n_predict`, the OpenAI APIs' `max_tokens`). Its answer was **cut by the context** when the server
says it stopped on a length limit with fewer than N tokens:
    llama-server's native `stop_type: "limit"`   (n_predict reached, or the slot's context full)
    the OpenAI `finish_reason: "length"`         (max_tokens reached, or the context)
    Anthropic's `stop_reason: "max_tokens"`      (recorded as `finish_reason`)
Fewer than N tokens is what tells the context from the asked length. Any other successful answer
with fewer than N tokens is **short**: the model stopped (EOS, a stop word), as it may; under
`--ignore-eos` it should not, so a short answer is then a warning. Failed requests, and answers
whose token count or asked length is unknown, are neither.

Pure: records in, counts out. `AnswerTally` keeps a level's counts as its records stream (and merges
a worker process's part), so a level judged against the run's n_predict needs no record kept.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import msgspec

from ..core.records import RequestRecord

CUT, SHORT = "cut", "short"
LIMIT_STOP_TYPES = frozenset({"limit"})
LIMIT_FINISH_REASONS = frozenset({"length", "max_tokens"})


def judge_answer(stop_type: str | None, finish_reason: str | None, tokens: int | None,
                 asked: int | None) -> str | None:
    """"cut", "short", or None (a full answer, or nothing to judge by); see the module docstring."""
    if tokens is None or asked is None or tokens >= asked:
        return None
    if stop_type in LIMIT_STOP_TYPES or finish_reason in LIMIT_FINISH_REASONS:
        return CUT
    return SHORT


class AnswerPart(msgspec.Struct, frozen=True):
    """An `AnswerTally` as a worker process sends it (`AnswerTally.part`, `merge`)."""

    cut: int = 0
    short: int = 0
    limit_at: dict[int, int] = {}
    other_at: dict[int, int] = {}


class AnswerTally:
    """A level's cut and short answers as its records arrive. A record that carries its own asked
    length is judged at once; one that asks the run's n_predict is kept as its token count (how
    many stopped on a limit, and otherwise, at each count) and judged when `counts` is given it."""

    __slots__ = ("cut", "short", "limit_at", "other_at")

    def __init__(self) -> None:
        self.cut = self.short = 0
        self.limit_at: Counter[int] = Counter()  # token counts of limit stops, asked length not on the record
        self.other_at: Counter[int] = Counter()  # and of the other stops

    def add(self, records: Iterable[RequestRecord]) -> None:
        for r in records:
            if r.error_kind is not None:
                continue
            tokens = r.output_tokens
            if tokens is None:
                continue
            if r.n_predict_target is not None:
                verdict = judge_answer(r.stop_type, r.finish_reason, tokens, r.n_predict_target)
                self.cut += verdict == CUT
                self.short += verdict == SHORT
            elif r.stop_type in LIMIT_STOP_TYPES or r.finish_reason in LIMIT_FINISH_REASONS:
                self.limit_at[tokens] += 1
            else:
                self.other_at[tokens] += 1

    def counts(self, n_predict: int | None) -> tuple[int, int]:
        """(answers cut by the context, short answers), those without their own asked length
        judged against `n_predict` (None: unknown, not judged)."""
        if n_predict is None:
            return self.cut, self.short
        return (self.cut + sum(n for tokens, n in self.limit_at.items() if tokens < n_predict),
                self.short + sum(n for tokens, n in self.other_at.items() if tokens < n_predict))

    def part(self) -> AnswerPart:
        """The tally as a worker process sends it (`merge` adds it)."""
        return AnswerPart(self.cut, self.short, dict(self.limit_at), dict(self.other_at))

    def merge(self, part: AnswerPart) -> None:
        self.cut += part.cut
        self.short += part.short
        self.limit_at.update(part.limit_at)  # Counter.update adds
        self.other_at.update(part.other_at)

    def clear(self) -> None:
        self.cut = self.short = 0
        self.limit_at.clear()
        self.other_at.clear()
