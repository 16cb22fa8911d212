"""Every per-request metric as one object: its name, unit, headers, and both of its definitions.

A `Metric` holds side by side what every reader needs of one figure (AIPerf's one class per
metric, as frozen records here): the per-record definition (`per_record`: a `RequestRecord` ->
its value, or None where the request has none), the vectorised one (`vectorised`: a `Batch` of
records as numpy columns -> the values of the records that have one, in record order), the name
(llama-server's field name where it has one: `predicted_ms`), the unit, the table headers, the
run.json key and, where loadgen serves it live, its Prometheus histogram. The two definitions are
held equal on random records by tests/test_metric_defs.py; so the level's aggregate
(analysis/aggregate.py), the exporters, the tables and the live metrics read this module, and
a metric is added by registering one `Metric` (`register`), nothing else.

Every time is on the monotonic clock; `start` is a request's intended send (open loop: the
schedule's; closed loop: the actual send), so a latency from it is corrected for coordinated
omission. Records whose error kind is client-side (cancelled at Ctrl-C, lost with a worker)
count in no metric but the send lag; failed ones in none but the send lag and the connect time.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from itertools import chain

import numpy as np

from ..core import records
from ..core.records import RequestRecord
from . import cache

# --- per-record definitions (what every one-record reader calls: saturation, compare, exports)


def latency_ms(r: RequestRecord) -> float:
    """End-to-end latency from the intended send: (complete - start) / 1e6."""
    return (r.complete_ns - r.start_ns) / 1e6


def latency_uncorrected_ms(r: RequestRecord) -> float:
    """Latency from the actual send: (complete - send) / 1e6 (what a coordinated-omission-prone tool reports)."""
    return (r.complete_ns - r.send_ns) / 1e6


def schedule_lag_ms(r: RequestRecord) -> float:
    """(actual send - intended send) / 1e6 (0 in closed loop)."""
    return (r.send_ns - r.start_ns) / 1e6


def ttft_ms(r: RequestRecord) -> float | None:
    """(first content chunk - start) / 1e6; None without a streamed content chunk."""
    return None if r.first_token_ns is None else (r.first_token_ns - r.start_ns) / 1e6


def ttft_queue_ms(r: RequestRecord) -> float | None:
    """max(0, TTFT - prompt_ms): the part of TTFT that was not the server's prefill (slot wait + HTTP)."""
    ttft = ttft_ms(r)
    return None if ttft is None or r.prompt_ms is None else max(0.0, ttft - r.prompt_ms)


def tpot_ms(r: RequestRecord) -> float | None:
    """(last token - first token) / 1e6 / (tokens - 1), tokens from the server's count; None below 2."""
    n = r.output_tokens
    if r.first_token_ns is None or r.last_token_ns is None or n is None or n < 2:
        return None
    return (r.last_token_ns - r.first_token_ns) / 1e6 / (n - 1)


def itl_ms(r: RequestRecord) -> list[float]:
    """Gaps between successive content chunks, in ms; never negative (client/sse.py clamps a read
    stamped before the previous one at 0, and so does this for runs recorded before it did)."""
    return [max(g, 0) / 1000 for g in r.chunk_gaps_us] if r.chunk_gaps_us else []


def service_ms(r: RequestRecord) -> float | None:
    """Server-side work: prompt_ms + predicted_ms, or None without timings."""
    if r.prompt_ms is None or r.predicted_ms is None:
        return None
    return r.prompt_ms + r.predicted_ms


def queue_wait_ms(r: RequestRecord) -> float | None:
    """max(0, latency - prompt_ms - predicted_ms) from the actual send (a late client is not the
    server's queue); None for a failed request or one without timings."""
    service = service_ms(r)
    if not r.ok or service is None:
        return None
    return max(0.0, latency_uncorrected_ms(r) - service)


def decode_tok_s(r: RequestRecord) -> float | None:
    """Per-request decode speed as the server measured it (timings.predicted_per_second)."""
    return r.predicted_per_second if r.ok else None


def prompt_tok_s(r: RequestRecord) -> float | None:
    """Prefill speed of one request as the server measured it: prompt_n / prompt_ms × 1000."""
    if not r.ok or not r.prompt_n or not r.prompt_ms:
        return None
    return r.prompt_n / r.prompt_ms * 1000


def _ok(fn: Callable[[RequestRecord], float | None]) -> Callable[[RequestRecord], float | None]:
    """`fn` of a successful request; None for a failed one (it adds no latency to a level)."""
    def of_ok(r: RequestRecord) -> float | None:
        return fn(r) if r.ok else None
    of_ok.__doc__ = fn.__doc__
    return of_ok


def _counted(fn: Callable[[RequestRecord], float | None]) -> Callable[[RequestRecord], float | None]:
    """`fn` of a request that the server saw (not cancelled at Ctrl-C nor lost with a worker)."""
    def of_counted(r: RequestRecord) -> float | None:
        return None if r.error_kind in records.CLIENT_SIDE else fn(r)
    of_counted.__doc__ = fn.__doc__
    return of_counted


def _timed_ttft_ms(r: RequestRecord) -> float | None:
    return ttft_ms(r) if r.ok and (r.first_token_ns is not None or r.chunk_gaps_us) else None


def _ok_itl_ms(r: RequestRecord) -> list[float]:
    return itl_ms(r) if r.ok else []


def _connect_ms(r: RequestRecord) -> float | None:
    """The connect time of a request that opened its connection (connect_us / 1e3)."""
    return None if r.connect_us is None else r.connect_us / 1e3


# --- vectorised definitions: a batch of records as columns


def _floats(column: Sequence[float | None]) -> np.ndarray:
    """A column of numbers or None as float64, None as NaN."""
    try:
        return np.array(column, dtype=np.float64)
    except TypeError:
        return np.array([math.nan if v is None else v for v in column], dtype=np.float64)


def input_tokens(r: RequestRecord) -> int | None:
    """The request's prompt tokens as the server counted them: prompt_n + cache_n (processed and
    reused from the cache), else usage.prompt_tokens; None when it said neither."""
    if r.prompt_n is not None:
        return r.prompt_n + (r.cache_n or 0)
    return r.usage.prompt_tokens if r.usage is not None else None


class Batch:
    """A batch of records as numpy columns: what every vectorised definition reads. Each field is
    read once, when a definition first needs it (one C call per record: `map(attrgetter)`, about
    twice as fast as transposing whole rows with `zip(*rows)`), so a reader that needs few
    columns (the live metrics) pays for few."""

    def __init__(self, batch: Sequence[RequestRecord]) -> None:
        self.records = batch
        self.errors = self._field("error_kind")
        send = self._field("send_ns")
        self.send = np.array(send, dtype=np.int64)
        self.complete = np.array(self._field("complete_ns"), dtype=np.int64)
        intended = self._field("intended_ns")
        if None in intended:  # records written before every record carried its intended send
            self.start = np.array([s if i is None else i for s, i in zip(send, intended)], dtype=np.int64)
        else:
            self.start = np.array(intended, dtype=np.int64)
        self.ok = np.array([e is None for e in self.errors], dtype=bool)
        self.first_token_raw = self._field("first_token_ns")
        self.gaps = self._field("chunk_gaps_us")
        self.any_streamed = any(t is not None for t in self.first_token_raw) or any(self.gaps)

    def _field(self, name: str) -> list:
        return list(map(operator.attrgetter(name), self.records))

    # Columns only some definitions read: made when first read (the live metrics read few of them).
    @cached_property
    def counted(self) -> np.ndarray:
        """Requests the server saw: not cancelled at Ctrl-C nor lost with a worker."""
        return np.array([e not in records.CLIENT_SIDE for e in self.errors], dtype=bool)

    @cached_property
    def prompt_ms(self) -> np.ndarray:
        return _floats(self._field("prompt_ms"))

    @cached_property
    def predicted_ms(self) -> np.ndarray:
        return _floats(self._field("predicted_ms"))

    @cached_property
    def decode_tok_s(self) -> np.ndarray:
        return _floats(self._field("predicted_per_second"))

    @cached_property
    def connect_us(self) -> np.ndarray:
        return _floats(self._field("connect_us"))

    @cached_property
    def input_tokens(self) -> np.ndarray:
        """Prompt tokens as the server counted them (`input_tokens`), 0 for none."""
        return np.array([input_tokens(r) or 0 for r in self.records], dtype=np.int64)

    @cached_property
    def tokens(self) -> np.ndarray:
        """Output tokens as the server counted them (`RequestRecord.output_tokens`), 0 for none."""
        predicted_n = self._field("predicted_n")
        if None in predicted_n:
            return np.array([r.output_tokens or 0 for r in self.records], dtype=np.int64)
        return np.array(predicted_n, dtype=np.int64)

    @cached_property
    def first_known(self) -> np.ndarray:
        return np.array([t is not None for t in self.first_token_raw], dtype=bool)

    @cached_property
    def streamed(self) -> np.ndarray:
        """Successful requests with a content event or a gap."""
        return self.ok & (self.first_known | np.array([bool(g) for g in self.gaps], dtype=bool))

    @cached_property
    def timed(self) -> np.ndarray:
        """Streamed requests whose first content event's time is known."""
        return self.streamed & self.first_known

    @cached_property
    def first_token(self) -> np.ndarray:
        return np.array([t or 0 for t in self.first_token_raw], dtype=np.int64)

    @cached_property
    def last_token_raw(self) -> list[int | None]:
        return self._field("last_token_ns")

    @cached_property
    def last_token(self) -> np.ndarray:
        return np.array([t or 0 for t in self.last_token_raw], dtype=np.int64)

    @cached_property
    def ttft_ms(self) -> np.ndarray:
        return (self.first_token - self.start) / 1e6

    # speculation (timings.draft_n, draft_n_accepted) and reasoning tokens, NaN where not carried
    @cached_property
    def draft_n(self) -> np.ndarray:
        return _floats(self._field("draft_n"))

    @cached_property
    def draft_n_accepted(self) -> np.ndarray:
        return _floats(self._field("draft_n_accepted"))

    @cached_property
    def reasoning_tokens(self) -> np.ndarray:
        return _floats(self._field("reasoning_tokens"))

    @cached_property
    def ttfa_ms(self) -> np.ndarray:
        """Time to the first answer token: the first answer event where the request reasoned, else
        its first event (analysis/reasoning.py); NaN where a reasoning request never answered."""
        thought = np.array([bool(n) for n in self._field("reasoning_tokens")], dtype=bool)
        answer_raw = self._field("first_answer_ns")
        answered = np.array([t is not None for t in answer_raw], dtype=bool)
        answer = np.array([t or 0 for t in answer_raw], dtype=np.int64)
        ms = (np.where(thought, answer, self.first_token) - self.start) / 1e6
        return np.where(thought & ~answered, np.nan, ms)

    @cached_property
    def uncorrected_ms(self) -> np.ndarray:
        return (self.complete - self.send) / 1e6


def _v_latency(b: Batch) -> np.ndarray:
    return ((b.complete - b.start) / 1e6)[b.ok]


def _v_latency_uncorrected(b: Batch) -> np.ndarray:
    return b.uncorrected_ms[b.ok]


def _v_queue_wait(b: Batch) -> np.ndarray:
    service = b.prompt_ms + b.predicted_ms  # NaN without timings: no queue wait
    return np.maximum(0.0, b.uncorrected_ms - service)[b.ok & ~np.isnan(service)]


def _v_predicted_ms(b: Batch) -> np.ndarray:
    return b.predicted_ms[b.ok & ~np.isnan(b.predicted_ms)]


def _v_prompt_ms(b: Batch) -> np.ndarray:
    return b.prompt_ms[b.ok & ~np.isnan(b.prompt_ms)]


def _v_decode_tok_s(b: Batch) -> np.ndarray:
    return b.decode_tok_s[b.ok & ~np.isnan(b.decode_tok_s)]


def _v_schedule_lag(b: Batch) -> np.ndarray:
    return ((b.send - b.start) / 1e6)[b.counted]


def _v_connect(b: Batch) -> np.ndarray:
    return (b.connect_us / 1e3)[~np.isnan(b.connect_us)]


def _v_ttft(b: Batch) -> np.ndarray:
    return b.ttft_ms[b.timed] if b.any_streamed else np.empty(0)


def _v_ttft_queue(b: Batch) -> np.ndarray:
    if not b.any_streamed:
        return np.empty(0)
    return np.maximum(0.0, b.ttft_ms - b.prompt_ms)[b.timed & ~np.isnan(b.prompt_ms)]


def _v_tpot(b: Batch) -> np.ndarray:
    if not b.any_streamed:
        return np.empty(0)
    per_token = b.timed & np.array([t is not None for t in b.last_token_raw], dtype=bool) & (b.tokens >= 2)
    return ((b.last_token - b.first_token) / 1e6 / np.maximum(b.tokens - 1, 1))[per_token]


def _v_itl(b: Batch) -> np.ndarray:
    if not b.any_streamed:
        return np.empty(0)
    gaps = [g for g, keep in zip(b.gaps, b.streamed.tolist()) if keep and g]
    if not gaps:
        return np.empty(0)
    flat = np.fromiter(chain.from_iterable(gaps), dtype=np.int64, count=sum(map(len, gaps)))
    return np.maximum(flat, 0) / 1000


# --- the definitions

STATS = ("count", "mean", "p50", "p90", "p99", "max")  # a Distribution's fields, in file order


@dataclass(frozen=True)
class Live:
    """A metric served live as a Prometheus histogram: loadgen_<name> in seconds, labels target and level."""

    name: str  # without the loadgen_ prefix, e.g. "latency_seconds"
    help: str
    buckets_s: tuple[float, ...]


@dataclass(frozen=True)
class Metric:
    """One per-request metric. `summary`: how a level keeps it in run.json: "distribution" (key
    `key`: count, mean, p50, p90, p99, max) or "mean" (key `key`: the exact mean alone); a level
    keeps a histogram of every metric (exports and --metric read it). `table`: the latency detail table's columns, (header,
    statistic). `csv`: the levels.csv statistics (columns <key>_<stat>). `export`: a --metric of
    hgrm and hlog. `open_loop`: only an open-loop level has it (in closed loop the intended send is
    the actual one). `kept_if`: whether a level's records have the metric at all, where values alone
    do not say (a TTFA is a TTFT unless a request reported reasoning). `many`: several values per request (per_record gives a list). `tokens`: the values are token counts."""

    name: str
    unit: str
    header: str
    short: str
    formula: str
    per_record: Callable[[RequestRecord], float | None] | Callable[[RequestRecord], list[float]]
    vectorised: Callable[[Batch], np.ndarray]
    summary: str = "distribution"
    key: str = ""
    table: tuple[tuple[str, str], ...] = ()
    table_digits: int = 0
    table_order: int = 100
    csv: tuple[str, ...] = ()
    export: bool = True
    open_loop: bool = False
    many: bool = False
    live: Live | None = None
    tokens: bool = False  # values are token counts: kept exact in the histogram (aggregate._TokenSeries)
    kept_if: Callable[[Sequence[RequestRecord]], bool] | None = None

    def kept(self, records: Sequence[RequestRecord]) -> bool:
        """Whether these records (a level's, a run's) have this metric to export (`kept_if`)."""
        return self.kept_if is None or self.kept_if(records)

    @staticmethod
    def names_text(metrics: Sequence[Metric]) -> str:
        """"a, b or c": the names of `metrics`, as a help text lists them."""
        names = [m.name for m in metrics]
        return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else "".join(names)

    def __post_init__(self) -> None:
        if not self.key:
            object.__setattr__(self, "key", f"{self.name}_{self.unit}" if self.summary == "distribution"
                               else f"{self.name}_mean")

    def values(self, r: RequestRecord) -> list[float]:
        """The record's values of this metric: none, one, or (`many`) several."""
        v = self.per_record(r)
        if self.many:
            return list(v)  # type: ignore[arg-type]  # a `many` metric's per_record gives a list
        return [] if v is None else [v]  # type: ignore[list-item]  # otherwise per_record gives one float

    def columns(self, stats: Sequence[str] | None = None) -> list[str]:
        """levels.csv's column names of this metric: <key>_<stat>."""
        return [f"{self.key}_{s}" for s in (self.csv if stats is None else stats)]


_REGISTRY: dict[str, Metric] = {}


def register(metric: Metric) -> Metric:
    """Add a metric (its name must be new): every reader of `all_metrics` shows it from then on."""
    if metric.name in _REGISTRY:
        raise ValueError(f"metric {metric.name!r} is defined already")
    _REGISTRY[metric.name] = metric
    return metric


@contextmanager
def registered(metric: Metric) -> Iterator[Metric]:
    """`register` for the length of a with-block (a test's metric), then forgotten."""
    register(metric)
    try:
        yield metric
    finally:
        del _REGISTRY[metric.name]


def all_metrics() -> list[Metric]:
    """Every metric, in registration order (the order of exports and of --metric's choices)."""
    return list(_REGISTRY.values())


def get(name: str) -> Metric:
    return _REGISTRY[name]


LATENCY = register(Metric(
    "latency", "ms", "latency ms", "E2E", "last response byte − start, of a successful request. Includes any "
    "wait for a slot, and the connect when the request had to open its connection.",
    _ok(latency_ms), _v_latency, table=(("E2E ms p99\nfrom intended", "p99"),), table_order=5,
    csv=STATS, live=Live("latency_seconds", "End-to-end latency from the intended send",
                         (0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300, 600))))
LATENCY_UNCORRECTED = register(Metric(
    "latency_uncorrected", "ms", "uncorrected latency ms", "E2E uncorrected", "last response byte − actual send "
    "(what a tool that ignores coordinated omission reports).",
    _ok(latency_uncorrected_ms), _v_latency_uncorrected, table=(("E2E p99 from\nactual send", "p99"),),
    table_order=6, csv=("mean", "p50", "p99"), open_loop=True))
QUEUE_WAIT = register(Metric(
    "queue_wait", "ms", "queue wait ms", "queue wait", "max(0, uncorrected latency − `prompt_ms` − "
    "`predicted_ms`): time a request waited for a free slot (llama-server defers it when all `--parallel` "
    "slots are busy) plus tokenization and HTTP overhead — that overhead is its floor, a few ms on loopback.",
    queue_wait_ms, _v_queue_wait, csv=STATS,
    live=Live("queue_wait_seconds", "Latency - prompt_ms - predicted_ms: waiting for a slot, plus HTTP",
              (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 60, 120, 300))))
PREDICTED_MS = register(Metric(
    "predicted_ms", "ms", "predicted_ms", "predicted_ms", "server (`timings.predicted_ms`): first token → last "
    "token (its histogram is exported too).",
    _ok(lambda r: r.predicted_ms), _v_predicted_ms, summary="mean"))
TTFT = register(Metric(
    "ttft", "ms", "TTFT ms", "TTFT", "first content chunk − start (streaming). llama-server sends a queued "
    "stream's headers only when a slot takes it, so TTFT includes the slot wait.",
    _timed_ttft_ms, _v_ttft, table=(("TTFT ms\np50", "p50"), ("TTFT\np99", "p99")), table_order=0,
    csv=("mean", "p50", "p99"),
    live=Live("time_to_first_token_seconds", "Time to the first content chunk (streaming)",
              (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 7.5, 10, 15, 20, 30, 60, 120))))
TTFT_QUEUE = register(Metric(
    "ttft_queue", "ms", "TTFT − prompt_ms ms", "TTFT queue", "max(0, TTFT − `prompt_ms`): the part of TTFT that "
    "was not prefill: slot wait + tokenization + HTTP (\"queue share\").",
    lambda r: ttft_queue_ms(r) if _timed_ttft_ms(r) is not None else None, _v_ttft_queue,
    table=(("TTFT − prompt_ms\np50 (queue)", "p50"),), table_order=1))
TPOT = register(Metric(
    "tpot", "ms", "TPOT ms", "TPOT", "(last content chunk − first content chunk) / (output tokens − 1), per "
    "request; tokens as the server counted them.",
    lambda r: tpot_ms(r) if _timed_ttft_ms(r) is not None else None, _v_tpot,
    table=(("TPOT ms\nmean", "mean"),), table_digits=1, table_order=2, csv=("mean", "p50", "p99")))
SCHEDULE_LAG = register(Metric(
    "schedule_lag", "ms", "send lag ms", "send lag", "actual send − intended send, of every "
    "request the server saw (failed ones too).",
    _counted(schedule_lag_ms), _v_schedule_lag, table=(("send lag\nms p99", "p99"),), table_digits=1,
    table_order=7, csv=("mean", "p50", "p99"), open_loop=True,
    kept_if=lambda rs: any(r.intended_ns not in (None, r.send_ns) for r in rs)))
ITL = register(Metric(
    "itl", "ms", "ITL ms", "ITL", "each gap between two successive content chunks (streaming). A chunk may carry "
    "more than one token, so ITL is per chunk and TPOT per token. Never negative: a read whose kernel receive "
    "stamp lands before the previous read's stamp counts as a gap of 0.",
    _ok_itl_ms, _v_itl, table=(("ITL ms\np50", "p50"), ("ITL\np99", "p99")), table_digits=1, table_order=3,
    csv=("mean", "p50", "p99"), many=True,
    live=Live("inter_token_latency_seconds", "Gaps between successive content chunks (streaming)",
              (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.06, 0.075, 0.1,
               0.15, 0.2, 0.3, 0.5, 1, 2.5))))
CONNECT = register(Metric(
    "connect", "ms", "connect ms", "connect", "`connect_us` / 1e3 of each request that opened its connection inside "
    "the level's clock (TCP connect, plus the TLS handshake on https), failed ones too; their count is "
    "`connections_opened`.",
    _connect_ms, _v_connect, csv=("mean", "p50", "p99"), export=False))
PROMPT_MS = register(Metric(
    "prompt_ms", "ms", "prompt_ms", "prompt_ms", "server (`timings.prompt_ms`): slot starts the prompt → first "
    "token sampled. Excludes queue wait.",
    _ok(lambda r: r.prompt_ms), _v_prompt_ms, summary="mean", export=False))
DECODE_TOK_S = register(Metric(
    "decode_tok_s", "tok/s", "decode tok/s", "decode", "the server's per-request `timings.predicted_per_second` "
    "(tokens after the first / `predicted_ms`).",
    decode_tok_s, _v_decode_tok_s, summary="mean", export=False))

def ttfa_ms(r: RequestRecord) -> float | None:
    """Time to the first answer token (analysis/reasoning.py's rule), for successful streamed requests."""
    if not r.ok or r.first_token_ns is None:
        return None
    first = r.first_answer_ns if r.reasoning_tokens else r.first_token_ns
    return None if first is None else (first - r.start_ns) / 1e6


def _v_ttfa(b: Batch) -> np.ndarray:
    if not b.any_streamed:
        return np.empty(0)
    values = b.ttfa_ms[b.ok & b.first_known]
    return values[~np.isnan(values)]


TTFA = register(Metric(
    "ttfa", "ms", "TTFA ms", "TTFA", "time to the first answer token: the first answer content event − start "
    "(streaming); a request that reasoned first waits for its answer, one that did not equals its TTFT. Kept in "
    "run.json only for levels where a request reasoned.",
    ttfa_ms, _v_ttfa, csv=("mean", "p50", "p99"),
    kept_if=lambda rs: any(r.reasoning_tokens is not None for r in rs)))


# --- token counts per request (docs/workloads.md) and the prompt cache (analysis/cache.py)


def prompt_tokens(r: RequestRecord) -> int | None:
    """A successful request's prompt tokens as the server counted them: prompt_n (computed tokens
    only, on llama-server), else usage.prompt_tokens; None when it said neither."""
    if not r.ok:
        return None
    if r.prompt_n is not None:
        return r.prompt_n
    return r.usage.prompt_tokens if r.usage is not None else None


def _v_prompt_n(b: Batch) -> np.ndarray:
    values = _floats([prompt_tokens(r) for r in b.records])
    return values[~np.isnan(values)]


def _predicted_n(r: RequestRecord) -> int | None:
    """A successful request's output tokens as the server counted them; None for none."""
    return r.output_tokens or None if r.ok else None


def _v_predicted_n(b: Batch) -> np.ndarray:
    return b.tokens[b.ok & (b.tokens > 0)].astype(np.float64)


def _cache_n(r: RequestRecord) -> int | None:
    return r.cache_n if r.ok else None


def _v_cache_n(b: Batch) -> np.ndarray:
    values = _floats(b._field("cache_n"))
    return values[b.ok & ~np.isnan(values)]


def _ttft_of(hit: bool) -> Callable[[RequestRecord], float | None]:
    def ttft_if(r: RequestRecord) -> float | None:
        return _timed_ttft_ms(r) if cache.is_hit(r.cache_n, r.prompt_n) is hit else None
    return ttft_if


def _v_ttft_of(hit: bool) -> Callable[[Batch], np.ndarray]:
    def vectorised(b: Batch) -> np.ndarray:
        if not b.any_streamed:
            return np.empty(0)
        chosen = np.array([cache.is_hit(r.cache_n, r.prompt_n) is hit for r in b.records], dtype=bool)
        return b.ttft_ms[b.timed & chosen]
    return vectorised


PROMPT_N = register(Metric(
    "prompt_n", "tokens", "prompt tokens", "prompt tokens", "the prompt tokens of each successful request as "
    "the server counted them: `timings.prompt_n`, else `usage.prompt_tokens`. Exact up to 2,048, then to 3 "
    "significant digits (a percentile is the lowest count of its bucket), the max exact. With a drawn workload "
    "([Workloads](workloads.md)) the realised input distribution.",
    prompt_tokens, _v_prompt_n, key="prompt_n", export=False, tokens=True))
PREDICTED_N = register(Metric(
    "predicted_n", "tokens", "answer tokens", "answer tokens", "each successful request's generated tokens: "
    "`timings.predicted_n`, else `tokens_predicted`, else `usage.completion_tokens` (requests with none left "
    "out); a record's `n_predict_target` is what it asked for (a drawn workload only).",
    _predicted_n, _v_predicted_n, key="predicted_n", export=False, tokens=True))
CACHE_N = register(Metric(
    "cache_n", "tokens", "reused prompt tokens", "cache_n", "`timings.cache_n` of each successful request: "
    "prompt tokens taken from the server's prompt cache instead of computed (llama-server's `prompt_n` counts "
    "only the computed ones). Kept only when some request reused a token ([Prompt cache](cache.md)).",
    _cache_n, _v_cache_n, key="cache_n", export=False, tokens=True))
TTFT_CACHE_HIT = register(Metric(
    "ttft_cache_hit", "ms", "TTFT of cache hits ms", "TTFT hit", "TTFT of the streamed requests that reused at "
    "least half their prompt (`cache_n` ≥ ½ (`cache_n` + `prompt_n`)). Kept only with `cache_n`.",
    _ttft_of(True), _v_ttft_of(True), export=False))
TTFT_CACHE_MISS = register(Metric(
    "ttft_cache_miss", "ms", "TTFT of cache misses ms", "TTFT miss", "TTFT of the other streamed requests with "
    "timings. Kept only with `cache_n`.",
    _ttft_of(False), _v_ttft_of(False), export=False))

# --percentiles: the metrics whose chosen percentiles a level keeps (run.json's per-level
# "percentiles", keyed by each metric's key), and how a percentile is named there and in tables.
PERCENTILE_METRICS = (TTFT, LATENCY, TPOT, ITL)


def percentile_label(q: float) -> str:
    """A percentile's name in run.json, tables and levels.csv: 50 -> "p50", 99.9 -> "p99.9"."""
    return f"p{q:g}"


def parse_percentiles(text: str) -> tuple[float, ...]:
    """"50,95,99.9" -> (50.0, 95.0, 99.9), sorted: each a number above 0 and at most 100, given once.
    ValueError (one sentence) otherwise."""
    items = [s.strip().removeprefix("p") for s in text.split(",")]
    if not text.strip() or any(not s for s in items):
        raise ValueError(f"expected percentiles like 50,95,99.9, got {text!r}")
    values: list[float] = []
    for s in items:
        try:
            q = float(s)
        except ValueError:
            raise ValueError(f"{s!r} is not a percentile (a number like 99.9)") from None
        if not 0 < q <= 100 or math.isnan(q):
            raise ValueError(f"percentile {s} is out of range (above 0, at most 100)")
        if q in values:
            raise ValueError(f"percentile {s} is given twice")
        values.append(q)
    return tuple(sorted(values))


# The fields of a level summary that are built in (core/rundoc.LevelSummary); any other metric's
# distribution goes into its `metrics` map.
BUILT_IN = frozenset(m.name for m in all_metrics())


# --- judged answers (structured output, tools: core/answer_check.py): not built-in fields of a
# level summary, so run.json keeps them under the level's `metrics` map.

def _output_valid(r: RequestRecord) -> float | None:
    return None if r.output_valid is None else float(r.output_valid)


def _v_output_valid(b: Batch) -> np.ndarray:
    values = b._field("output_valid")
    if values.count(None) == len(values):  # a plain run's batch: one C-level count, nothing judged
        return np.empty(0)
    return np.array([v for v in values if v is not None], dtype=np.float64)


def _tool_calls(r: RequestRecord) -> float | None:
    return None if r.tool_calls is None or r.error_kind in records.CLIENT_SIDE else float(r.tool_calls)


def _v_tool_calls(b: Batch) -> np.ndarray:
    if b._field("tool_calls").count(None) == len(b.records):  # no tools offered
        return np.empty(0)
    return np.array([float(r.tool_calls) for r in b.records
                     if r.tool_calls is not None and r.error_kind not in records.CLIENT_SIDE], dtype=np.float64)


OUTPUT_VALID = register(Metric(
    "output_valid", "share", "valid answers", "valid", "1 for an answer judged valid (it parses as JSON and "
    "matches --json-schema; its tool calls name offered tools with arguments matching their parameters), 0 for "
    "a broken one (the failure `invalid_output`); answers cut at the length asked, and those of runs without a "
    "schema, grammar or tools, are not judged ([Request features](request-features.md)). The mean is the "
    "validity share, the count the answers judged.",
    _output_valid, _v_output_valid, key="output_valid", table=(("valid\nshare", "mean"),), table_digits=3,
    table_order=90, csv=("count", "mean"), export=False))
TOOL_CALLS = register(Metric(
    "tool_calls", "calls", "tool calls per answer", "tool calls", "the `tool_calls` an answer made, of requests "
    "that offered tools (--tools).",
    _tool_calls, _v_tool_calls, summary="mean", key="tool_calls_mean", export=False))


def docs_table() -> str:
    """The per-request metrics as docs/metrics.md shows them (tests/test_docs.py holds the page to
    it; scripts/metrics-doc writes it there): one row per metric, its run.json key, unit, formula."""
    rows = ["| metric, run.json key | unit | definition |", "|---|---|---|"]
    for m in all_metrics():
        how = "the mean" if m.summary == "mean" else "count, mean, p50, p90, p99, max"
        only = "; open loop only" if m.open_loop else ""
        rows.append(f"| {m.short}, `{m.key}` | {m.unit} | {m.formula} A level keeps {how}{only}. |")
    return "\n".join(rows) + "\n"
