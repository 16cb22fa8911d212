"""What a target's answers prove: whether it served completions at all, and whether it is an LLM server.

A verdict needs evidence. A level where no request completed says nothing about how the server
scales, so the saturation rule reads only levels with a completed request, and a target with none
gets no verdict but the reason there is none (`no_verdict_line`). A target that answered every
request on the completion endpoint with "no such path" (HTTP 404), "no such method" (405, 501) or a
body that is not JSON is not an LLM server behind that API (`not_an_llm_server`): the run
names it and what it answered, and gives it up (exit 1), as for a target that does not speak HTTP.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from ..core import records
from ..core.records import RequestRecord

# The answers of a server that has no completion endpoint at the path asked for: no such path or
# method, or a 2xx body that is not JSON at all (JSON of the wrong shape may be an LLM server's quirk).
NOT_A_COMPLETION = ("http_404", "http_405", "http_501")


def _not_a_completion(r: RequestRecord) -> bool:
    return r.error_kind in NOT_A_COMPLETION or (
        r.error_kind == records.INVALID_JSON and (r.error_message or "").startswith(records.NOT_JSON_MESSAGE))


class Figures(msgspec.Struct, frozen=True):
    """The parts of a distribution (run.json's count, mean, p50, ...) the verdicts read."""

    mean: float | None = None
    p99: float | None = None


class LevelFigures(msgspec.Struct, frozen=True, kw_only=True):
    """What the verdicts read of a level's summary. `of` takes a typed level (`core.rundoc.Level`,
    `LevelSummary`) or its run.json dict, whole or a hand-made part of one: what it lacks is None
    (a level that does not count its requests is taken at its figures)."""

    level: int | float | None = None  # schema 2; else the concurrency is the level
    concurrency: int | None = None
    throughput_tok_s: float = 0.0
    requests_ok: int | None = None
    errors_by_kind: dict[str, int] = {}
    stopped_reason: str | None = None
    latency_ms: Figures | None = None
    latency_uncorrected_ms: Figures | None = None  # open loop only
    schedule_lag_ms: Figures | None = None  # open loop only
    rate: float | None = None  # open loop: the offered rate (None: none recorded)
    concurrency_reached: int | None = None  # the most requests in flight at once

    @classmethod
    def of(cls, level: Any) -> LevelFigures:
        return level if isinstance(level, cls) else msgspec.convert(level, cls, from_attributes=True, strict=False)

    @property
    def key(self) -> int | float:
        """The level: its "level", else its concurrency."""
        if self.level is not None:
            return self.level
        assert self.concurrency is not None, "a level summary names its level or its concurrency"
        return self.concurrency


def has_completed(level: LevelFigures) -> bool:
    """Whether a level completed a request; one that does not count its requests (a hand-made
    summary) is taken at its figures."""
    return level.requests_ok != 0


def completed_any(levels: Iterable[LevelFigures]) -> bool:
    """Whether any level has a completed request."""
    return any(has_completed(lv) for lv in levels)


def no_verdict_line(label: str, levels: Sequence[LevelFigures]) -> str:
    """The line said instead of a saturation verdict when no level completed a request."""
    errors: Counter[str] = Counter()
    for lv in levels:
        errors.update(lv.errors_by_kind)
    stopped = next((lv.stopped_reason for lv in levels if lv.stopped_reason), None)
    if errors:
        why = "every request failed (" + ", ".join(f"{k} ×{n}" for k, n in errors.most_common()) + ")"
        if stopped:
            why += f", then {stopped}"
    elif stopped:
        why = f"{stopped} before any request completed"
    else:
        why = "no request was sent"
    return f"{label}: no saturation verdict, because no level completed a request: {why}."


def not_an_llm_server(rs: Sequence[RequestRecord], endpoint: str) -> str | None:
    """What the target answered when every request failed as a server without a completion endpoint
    does ("POST /completion answered HTTP 501 to all 4 requests (...)"), else None."""
    sent = [r for r in rs if r.error_kind not in records.CLIENT_SIDE]
    if not sent or not all(_not_a_completion(r) for r in sent):
        return None
    kind, count = Counter(r.error_kind or "" for r in sent).most_common(1)[0]  # every one failed: never ""
    example = next(r for r in sent if r.error_kind == kind)
    answer = f"HTTP {kind.removeprefix('http_')}" if kind.startswith("http_") else "a body that is not JSON"
    told = (example.error_message or "").removeprefix(records.NOT_JSON_MESSAGE).lstrip(": ").strip()
    told = "an HTML page" if told[:1] == "<" else told[:100]  # a web server's error page says nothing more
    share = ("its one request" if len(sent) == 1 else f"all {len(sent)} requests" if count == len(sent)
             else f"{count} of {len(sent)} requests (the rest alike)")
    return f"not an LLM server at this API: {endpoint} answered {answer} to {share}" + (f" ({told})" if told else "")
