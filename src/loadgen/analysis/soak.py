"""Soak: steady load for hours through errors and restarts, and what its records say over time.

Pure functions over records (no I/O, no clock); run/soak.py drives the load.
A soak is one long closed-loop level. Its records are cut into windows by completion time:
- window throughput = Σ predicted_n of the window's successful requests / the window's length (s)
- error-free time   = total length of the windows in which no request failed
- longest error-free stretch = the longest time between two failed requests (or the soak's start
                     or end), on completion times
- drift            = mean throughput of the last k full windows / mean of the first k, with
                     k = max(1, 10% of the full windows), and Welch's t-test p-value over those
                     windows (None below 2 windows a side): a drift whose p ≥ 0.05 is noise.
- offered load     = requests sent / duration (req/s): every request the workers sent, whatever
                     its answer, cancelled ones included (they left). A closed loop's offered load
                     is what the server let it be; reported so a soak can be set beside a sweep.
Requests cancelled when the soak was stopped are neither counted as ok nor as failures.

With latency targets (`--slo`, analysis/slo.py), every request but the client's cancelled or lost
ones is judged, by completion time into its window as above:
- a window's attainment = good / judged (None when it judged nothing); its goodput = good requests
  / its length (req/s) and their output tokens / its length (tok/s)
- overall: the same over the whole soak (per second of its duration); it passes when attainment >=
  the required attainment (`--attainment`)
- attainment drift: pooled good / judged of the first k full windows against the last k (the same
  k as the throughput drift), change = last − first, and a one-sided Fisher exact test that the
  last k's share of good requests is lower: attainment is *falling* when the last is below the
  first and p < 0.05 (None when either side judged nothing).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..core import records
from ..core.records import RequestRecord
from .slo import Slo, judge

DRIFT_SHARE = 0.10  # the first and last tenth of the windows are compared
DRIFT_P = 0.05


def window_seconds(duration_s: float) -> float:
    """60 s windows; a soak shorter than 10 minutes gets ten windows, each at least 1 s."""
    return min(60.0, max(1.0, duration_s / 10))


@dataclass(frozen=True, slots=True)
class SoakWindow:
    start_s: float  # since the soak's start
    end_s: float
    requests_ok: int
    errors_by_kind: dict[str, int]
    output_tokens: int
    # --slo: requests judged, the good ones and their output tokens (None: the soak had no SLO)
    judged: int | None = None
    good: int = 0
    good_tokens: int = 0

    @property
    def length_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def attainment(self) -> float | None:
        return self.good / self.judged if self.judged else None

    @property
    def throughput_tok_s(self) -> float:
        return self.output_tokens / self.length_s if self.length_s > 0 else 0.0

    @property
    def requests_failed(self) -> int:
        return sum(self.errors_by_kind.values())

    def to_dict(self) -> dict:
        out = {"start_s": self.start_s, "end_s": self.end_s, "requests_ok": self.requests_ok,
               "requests_failed": self.requests_failed, "errors_by_kind": dict(self.errors_by_kind),
               "output_tokens": self.output_tokens, "throughput_tok_s": self.throughput_tok_s}
        if self.judged is not None:
            length = self.length_s
            out |= {"judged": self.judged, "good": self.good, "attainment": self.attainment,
                    "goodput_req_s": self.good / length if length > 0 else 0.0,
                    "goodput_tok_s": self.good_tokens / length if length > 0 else 0.0}
        return out


def _tokens(r: RequestRecord) -> int:
    n = r.predicted_n if r.predicted_n is not None else r.tokens_predicted
    return n or 0


class SoakTally:
    """A soak's per-window counts gathered batch by batch (a streamed soak keeps only these).

    Windows are indexed by completion time from the soak's start; failures' completion times are
    swept in order per batch for the longest error-free stretch (records complete in nearly the
    order they are added, so only marks within a batch need sorting).
    """

    def __init__(self, window_s: float, slo: Slo | None = None) -> None:
        self.window_s, self.length_ns = window_s, int(window_s * 1e9)
        self.slo = slo  # --slo: each request judged into its window too
        self.judged: Counter[int] = Counter()
        self.good: Counter[int] = Counter()
        self.good_tokens: Counter[int] = Counter()
        self.ok: Counter[int] = Counter()
        self.tokens: Counter[int] = Counter()
        self.errors: dict[int, Counter[str]] = {}
        self.sent = 0
        self.first_mark: int | None = None
        self.last_mark: int | None = None
        self.longest_inner_ns = 0

    def add(self, rs: Sequence[RequestRecord], start_ns: int) -> None:
        self.sent += len(rs)
        marks = []
        for r in rs:
            if r.error_kind in records.CLIENT_SIDE:
                continue
            i = max(0, (r.complete_ns - start_ns) // self.length_ns)
            if self.slo is not None:
                self.judged[i] += 1
                if not judge(r, self.slo):
                    self.good[i] += 1
                    self.good_tokens[i] += r.output_tokens or 0
            if r.error_kind is None:  # r.ok, said so that the type of error_kind below is known
                self.ok[i] += 1
                self.tokens[i] += _tokens(r)
            else:
                self.errors.setdefault(i, Counter())[r.error_kind] += 1
                marks.append(max(r.complete_ns, start_ns))
        for m in sorted(marks):
            if self.last_mark is None:
                self.first_mark = m
            elif m > self.last_mark:
                self.longest_inner_ns = max(self.longest_inner_ns, m - self.last_mark)
            self.last_mark = m if self.last_mark is None else max(self.last_mark, m)

    def windows(self, start_ns: int, end_ns: int) -> list[SoakWindow]:
        """Consecutive windows from start to end (the last one may be shorter); later ones fold into it."""
        count = max(1, math.ceil((end_ns - start_ns) / self.length_ns))
        ok, tokens, judged, good, good_tokens = (self._folded(c, count) for c in (
            self.ok, self.tokens, self.judged, self.good, self.good_tokens))
        errors: list[Counter[str]] = [Counter() for _ in range(count)]
        for i, c in list(self.errors.items()):
            errors[min(i, count - 1)].update(dict(c))
        out = []
        for i in range(count):
            a = start_ns + i * self.length_ns
            b = min(end_ns, a + self.length_ns) if i == count - 1 else a + self.length_ns
            out.append(SoakWindow((a - start_ns) / 1e9, (max(a, b) - start_ns) / 1e9, ok[i],
                                  dict(sorted(errors[i].items())), tokens[i],
                                  None if self.slo is None else judged[i], good[i], good_tokens[i]))
        return out

    @staticmethod
    def _folded(counts: Counter[int], count: int) -> list[int]:
        """Per window index, windows past the last folded into it. A copy first (one step for the
        interpreter): a checkpoint reads this from another thread while the run adds to it."""
        out = [0] * count
        for i, n in list(counts.items()):
            out[min(i, count - 1)] += n
        return out

    def longest_error_free_s(self, start_ns: int, end_ns: int) -> float:
        """The longest time between two failures (or the start or end), marks clamped to the soak."""
        if self.first_mark is None or self.last_mark is None:
            return (end_ns - start_ns) / 1e9
        first, last = min(self.first_mark, end_ns), min(self.last_mark, end_ns)
        return max(first - start_ns, min(self.longest_inner_ns, end_ns - start_ns), end_ns - last) / 1e9


@dataclass(frozen=True, slots=True)
class SoakAttainment:
    """A soak judged against latency targets (--slo): overall, and its attainment drift (see the
    module docstring)."""

    required: float
    judged: int
    good: int
    goodput_req_s: float
    goodput_tok_s: float
    first_attainment: float | None  # pooled over the first k full windows
    last_attainment: float | None
    falling_p: float | None
    falling: bool | None

    @property
    def attainment(self) -> float | None:
        return self.good / self.judged if self.judged else None

    @property
    def passed(self) -> bool:
        return self.attainment is not None and self.attainment >= self.required

    def to_dict(self) -> dict:
        change = (None if self.first_attainment is None or self.last_attainment is None
                  else self.last_attainment - self.first_attainment)
        return {"required": self.required, "judged": self.judged, "good": self.good, "attainment": self.attainment,
                "passed": self.passed, "goodput_req_s": self.goodput_req_s, "goodput_tok_s": self.goodput_tok_s,
                "first_attainment": self.first_attainment, "last_attainment": self.last_attainment,
                "attainment_change": change, "falling_p": self.falling_p, "falling": self.falling}


def attainment_falling(first_good: int, first_judged: int, last_good: int,
                       last_judged: int) -> tuple[float | None, bool | None]:
    """(p, falling): a one-sided Fisher exact test that the last windows' share of good requests is
    below the first's; falling when it is lower and p < DRIFT_P. (None, None) when a side judged nothing."""
    if not first_judged or not last_judged:
        return None, None
    from scipy import stats

    table = [[first_good, first_judged - first_good], [last_good, last_judged - last_good]]
    p = float(stats.fisher_exact(table, alternative="greater").pvalue)
    return p, last_good / last_judged < first_good / first_judged and p < DRIFT_P


def _soak_attainment(tally: SoakTally, slo: Slo, full: list[SoakWindow], k: int, duration_s: float) -> SoakAttainment:
    first, last = (full[:k], full[-k:]) if k else ([], [])
    first_good, first_judged = sum(w.good for w in first), sum(w.judged or 0 for w in first)
    last_good, last_judged = sum(w.good for w in last), sum(w.judged or 0 for w in last)
    p, falling = attainment_falling(first_good, first_judged, last_good, last_judged)
    good = sum(tally.good.values())
    return SoakAttainment(
        required=slo.attainment, judged=sum(tally.judged.values()), good=good,
        goodput_req_s=good / duration_s if duration_s > 0 else 0.0,
        goodput_tok_s=sum(tally.good_tokens.values()) / duration_s if duration_s > 0 else 0.0,
        first_attainment=first_good / first_judged if first_judged else None,
        last_attainment=last_good / last_judged if last_judged else None, falling_p=p, falling=falling)


@dataclass(frozen=True, slots=True)
class SoakSummary:
    duration_s: float
    window_s: float
    requests_ok: int
    requests_failed: int
    errors_by_kind: dict[str, int]
    output_tokens: int
    throughput_tok_s: float  # output tokens / duration
    error_free_s: float
    longest_error_free_s: float
    first_throughput_tok_s: float | None  # mean of the first k full windows
    last_throughput_tok_s: float | None
    drift_windows: int  # k
    drift: float | None  # last / first - 1
    drift_p: float | None  # Welch's t-test over the k windows a side
    windows: list[SoakWindow] = field(default_factory=list)
    requests_sent: int = 0  # every request sent, whatever its answer (cancelled ones too)
    slo: SoakAttainment | None = None  # --slo

    @property
    def offered_req_s(self) -> float:
        return self.requests_sent / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def drift_significant(self) -> bool | None:
        return None if self.drift_p is None else self.drift_p < DRIFT_P

    def to_dict(self) -> dict:
        return {
            "duration_s": self.duration_s, "window_s": self.window_s, "requests_ok": self.requests_ok,
            "requests_failed": self.requests_failed, "errors_by_kind": dict(self.errors_by_kind),
            "output_tokens": self.output_tokens, "throughput_tok_s": self.throughput_tok_s,
            "requests_sent": self.requests_sent, "offered_req_s": self.offered_req_s,
            "error_free_s": self.error_free_s, "error_free_hours": self.error_free_s / 3600,
            "longest_error_free_s": self.longest_error_free_s,
            "first_throughput_tok_s": self.first_throughput_tok_s, "last_throughput_tok_s": self.last_throughput_tok_s,
            "drift_windows": self.drift_windows, "drift": self.drift, "drift_p": self.drift_p,
            "drift_significant": self.drift_significant,
            "windows": [w.to_dict() for w in self.windows],
            **({"slo": self.slo.to_dict()} if self.slo is not None else {}),
        }


def _welch_p(a: list[float], b: list[float]) -> float | None:
    if len(a) < 2 or len(b) < 2:
        return None
    from scipy import stats

    if len(set(a)) == 1 and len(set(b)) == 1:  # no spread at all: equal or plainly different
        return 1.0 if a[0] == b[0] else 0.0
    p = float(stats.ttest_ind(a, b, equal_var=False).pvalue)
    return p if math.isfinite(p) else None


def summarize_soak(rs: Sequence[RequestRecord], start_ns: int, end_ns: int,
                   window_s: float | None = None, slo: Slo | None = None) -> SoakSummary:
    tally = SoakTally(window_s or window_seconds(max(0.0, (end_ns - start_ns) / 1e9)), slo)
    tally.add(rs, start_ns)
    return summarize_tally(tally, start_ns, end_ns)


def summarize_tally(tally: SoakTally, start_ns: int, end_ns: int) -> SoakSummary:
    """A soak's summary from its tally (what a streamed soak keeps)."""
    duration_s = max(0.0, (end_ns - start_ns) / 1e9)
    window_s = tally.window_s
    windows = tally.windows(start_ns, end_ns)
    errors: Counter[str] = Counter()
    for c in list(tally.errors.values()):
        errors.update(dict(c))
    tokens = sum(tally.tokens.values())
    full = [w for w in windows if w.length_s >= window_s * 0.999]
    k = max(1, round(len(full) * DRIFT_SHARE)) if len(full) >= 2 else 0
    first = [w.throughput_tok_s for w in full[:k]]
    last = [w.throughput_tok_s for w in full[-k:]] if k else []
    first_mean = sum(first) / k if k else None
    last_mean = sum(last) / k if k else None
    drift = last_mean / first_mean - 1 if first_mean and last_mean is not None else None
    return SoakSummary(
        duration_s=duration_s, window_s=window_s, requests_ok=sum(tally.ok.values()),
        requests_failed=sum(errors.values()), errors_by_kind=dict(sorted(errors.items())), output_tokens=tokens,
        throughput_tok_s=tokens / duration_s if duration_s > 0 else 0.0,
        error_free_s=sum(w.length_s for w in windows if not w.errors_by_kind),
        longest_error_free_s=tally.longest_error_free_s(start_ns, end_ns) if end_ns > start_ns else 0.0,
        first_throughput_tok_s=first_mean, last_throughput_tok_s=last_mean, drift_windows=k, drift=drift,
        drift_p=_welch_p(first, last), windows=windows, requests_sent=tally.sent,
        slo=None if tally.slo is None else _soak_attainment(tally, tally.slo, full, k, duration_s))
