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
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..core import records
from ..core.records import RequestRecord

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

    @property
    def length_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def throughput_tok_s(self) -> float:
        return self.output_tokens / self.length_s if self.length_s > 0 else 0.0

    @property
    def requests_failed(self) -> int:
        return sum(self.errors_by_kind.values())

    def to_dict(self) -> dict:
        return {"start_s": self.start_s, "end_s": self.end_s, "requests_ok": self.requests_ok,
                "requests_failed": self.requests_failed, "errors_by_kind": dict(self.errors_by_kind),
                "output_tokens": self.output_tokens, "throughput_tok_s": self.throughput_tok_s}


def _tokens(r: RequestRecord) -> int:
    n = r.predicted_n if r.predicted_n is not None else r.tokens_predicted
    return n or 0


class SoakTally:
    """A soak's per-window counts gathered batch by batch (a streamed soak keeps only these).

    Windows are indexed by completion time from the soak's start; failures' completion times are
    swept in order per batch for the longest error-free stretch (records complete in nearly the
    order they are added, so only marks within a batch need sorting).
    """

    def __init__(self, window_s: float) -> None:
        self.window_s, self.length_ns = window_s, int(window_s * 1e9)
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
        ok, tokens = [0] * count, [0] * count
        errors: list[Counter[str]] = [Counter() for _ in range(count)]
        # Copies first (each one step for the interpreter): a checkpoint reads this from another
        # thread while the run adds to it.
        for i, n in list(self.ok.items()):
            ok[min(i, count - 1)] += n
        for i, n in list(self.tokens.items()):
            tokens[min(i, count - 1)] += n
        for i, c in list(self.errors.items()):
            errors[min(i, count - 1)].update(dict(c))
        out = []
        for i in range(count):
            a = start_ns + i * self.length_ns
            b = min(end_ns, a + self.length_ns) if i == count - 1 else a + self.length_ns
            out.append(SoakWindow((a - start_ns) / 1e9, (max(a, b) - start_ns) / 1e9, ok[i],
                                  dict(sorted(errors[i].items())), tokens[i]))
        return out

    def longest_error_free_s(self, start_ns: int, end_ns: int) -> float:
        """The longest time between two failures (or the start or end), marks clamped to the soak."""
        if self.first_mark is None or self.last_mark is None:
            return (end_ns - start_ns) / 1e9
        first, last = min(self.first_mark, end_ns), min(self.last_mark, end_ns)
        return max(first - start_ns, min(self.longest_inner_ns, end_ns - start_ns), end_ns - last) / 1e9


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
                   window_s: float | None = None) -> SoakSummary:
    tally = SoakTally(window_s or window_seconds(max(0.0, (end_ns - start_ns) / 1e9)))
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
        drift_p=_welch_p(first, last), windows=windows, requests_sent=tally.sent)
