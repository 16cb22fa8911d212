"""What every layer reads of a run document (run.json): a level's summary, the typed document, and
whether the run is open loop.

`LevelSummary` is the one schema of a level in run.json: analysis/aggregate.py computes it, the
results writer stores it (`to_dict`, field order = file order) and results/schema.py checks a file
against it on load. Fields a version-1 file or a damaged one may lack have defaults; the others
must be there for `report`, `export`, `compare` and `gate` to read the file.

`RunDocument.of(doc)` converts run.json's content (the checked, upgraded dict `results.reader.
load_run_dict` gives; `load_run` gives it typed) into msgspec Structs that every reader reads by attribute: the run's kind as a
`RunKind`, `open_loop` a property (`is_open_loop`, the one rule), per target its levels
(`LevelSummary` plus the --workers parts), its verdict, and its prefill, depth or soak section,
each typed. Every field a reader may find absent (an older file, a kind without it) has a default;
fields no reader reads are not here and are dropped, so a reader that passes run.json on verbatim
(the JSON and CSV exporters) reads the dict, not this. It lives in core so that analysis/ reads it too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import msgspec

from .errors import ResultsError
from .kinds import RunKind  # run.json's "kind" (core/kinds.py, the one list of kinds)


class Distribution(msgspec.Struct, frozen=True):
    """Mean (exact) and p50/p90/p99/max (HdrHistogram, µs resolution) of millisecond values."""

    count: int
    mean: float
    p50: float
    p90: float
    p99: float
    max: float

    def to_dict(self) -> dict[str, float | int]:
        return msgspec.structs.asdict(self)


class LevelTrim(msgspec.Struct, frozen=True):
    """--trim: the records a level's figures left out (analysis/trim.py): started in the first
    (`head`) or last (`tail`) `cut_s` seconds of its window; `too_short`: none was, the cut would
    have left no record."""

    head: int
    tail: int
    cut_s: float
    too_short: bool = False


CACHE_FIELDS = ("cache_n", "cache_hit_ratio", "ttft_cache_hit_ms", "ttft_cache_miss_ms", "prefill_saved_ms")


class LevelSummary(msgspec.Struct, frozen=True, kw_only=True):
    """The figures of one level on one target, as run.json stores them (see analysis/metrics.py)."""

    level: int | float  # the concurrency, or the request rate of an open-loop level
    concurrency: int  # closed loop: the level; open loop: the in-flight cap (0: none)
    rate: float | None = None  # open loop: requests/s
    achieved_rate: float | None = None  # open loop: the rate requests actually left at (metrics.achieved_rate)
    # The most requests in flight at once (analysis/metrics.py); None in files written before it.
    concurrency_reached: int | None = None
    requests_ok: int
    requests_failed: int
    requests_cancelled: int = 0
    # In flight in a worker process that died (error kind "lost"); absent from files without any.
    requests_lost: int = 0
    # Successful answers with fewer tokens than asked (analysis/cut_answers.py): stopped on the context
    # limit (`stop_type: limit`, `finish_reason: length`), and stopped otherwise (EOS, a stop word:
    # a warning only under --ignore-eos). Absent from run.json when none.
    answers_cut: int = 0
    answers_short: int = 0
    # Open loop: the requests its schedule held, and of those the ones never sent (the level was
    # stopped first: Ctrl-C, the target down); ok + failed + cancelled + lost + not_sent = scheduled.
    # Not records, and not failures. None (absent) in closed loop and in files written before them.
    requests_scheduled: int | None = None
    requests_not_sent: int | None = None
    errors_by_kind: dict[str, int] = {}
    output_tokens: int
    wall_s: float
    throughput_tok_s: float
    # Prompt tokens of the successful requests, successful requests per second, and (input + output)
    # tokens per second (analysis/metrics.py); None in files written before them.
    input_tokens: int | None = None
    request_rate: float | None = None
    total_tok_s: float | None = None
    latency_ms: Distribution | None = None
    queue_wait_ms: Distribution | None = None
    predicted_ms_mean: float | None
    prompt_ms_mean: float | None = None
    decode_tok_s_mean: float | None
    stopped_reason: str | None = None
    server_metrics_delta: dict[str, float] = {}
    ttft_ms: Distribution | None = None
    ttft_queue_ms: Distribution | None = None
    tpot_ms: Distribution | None = None
    itl_ms: Distribution | None = None
    latency_uncorrected_ms: Distribution | None = None  # open loop only
    schedule_lag_ms: Distribution | None = None  # open loop only
    # Requests that opened their connection inside the level's clock, and how long connecting took
    # them (metrics.connections_opened); None in files written before the fields.
    connections_opened: int | None = None
    connect_ms: Distribution | None = None
    # Per successful request, the tokens of its prompt (`prompt_n`, else usage.prompt_tokens) and of
    # its answer (`predicted_n`, else tokens_predicted or usage.completion_tokens): the workload as
    # realised (analysis/aggregate.py; HdrHistogram, 3 significant digits). None: no such count.
    prompt_n: Distribution | None = None
    predicted_n: Distribution | None = None
    # Prompt-cache figures (analysis/cache.py), present when any request reused a cached token:
    # cache_n per request, the token-weighted hit ratio Σcache_n / Σ(cache_n + prompt_n), TTFT of
    # cache hits and misses, the prefill time the reused tokens saved (estimate).
    cache_n: Distribution | None = None
    cache_hit_ratio: float | None = None
    ttft_cache_hit_ms: Distribution | None = None
    ttft_cache_miss_ms: Distribution | None = None
    prefill_saved_ms: float | None = None
    # The client's own load during the level (run/looplag.py); absent from a summary computed
    # from records alone.
    loop_lag_p99_ms: float | None = None
    loop_lag_max_ms: float | None = None
    client_cpu_fraction: float | None = None
    # Metrics registered beyond the built-in ones above (analysis/metric_defs.py), by name; absent
    # from a file without any.
    metrics: dict[str, Distribution | float] = {}
    # --percentiles: metric key (ttft_ms, latency_ms, tpot_ms, itl_ms) -> {"p95": ms, "p99.9": ms, ...},
    # the run's chosen percentiles (analysis/metric_defs.PERCENTILE_METRICS); absent without.
    percentiles: dict[str, dict[str, float]] | None = None
    # --trim: the records left out of this level's figures (analysis/trim.py); absent without.
    trimmed: LevelTrim | None = None
    # --slo: the level judged against the latency targets (analysis/slo.py `SloLevel`); absent without.
    slo: dict[str, Any] | None = None
    # Speculative decoding (analysis/speculation.py): Σ draft_n and Σ draft_n_accepted of the successful
    # requests, acceptance = their ratio (None: nothing drafted, "no speculation"), and drafted tokens
    # per output token. All None (and absent from run.json) when no request carried draft fields.
    draft_n: int | None = None
    draft_n_accepted: int | None = None
    acceptance: float | None = None
    drafted_per_output_token: float | None = None
    # Reasoning models (analysis/reasoning.py): Σ reasoning tokens of the successful requests, their
    # share of the output tokens, and the time to the first answer token (streaming). All None (and
    # absent from run.json) when no request reasoned.
    reasoning_tokens: int | None = None
    reasoning_share: float | None = None
    ttfa_ms: Distribution | None = None
    # The APIs that answer without generating (--api embeddings, rerank; analysis/embedding_check.py):
    # texts answered (successful requests × --items), texts/s and prompt tokens/s over the level's
    # wall. All None (absent from run.json) for a generation API.
    texts: int | None = None
    texts_per_s: float | None = None
    input_tok_s: float | None = None

    def to_dict(self, client_load: bool = False) -> dict[str, Any]:
        """The level as run.json holds it; the client-load fields only with `client_load`."""
        out = msgspec.to_builtins(self)
        for key in ("concurrency_reached", "connections_opened", "input_tokens", "request_rate", "total_tok_s"):  # a file written before keeps its shape
            if out[key] is None:
                del out[key]
        for key in ("requests_lost", "answers_cut", "answers_short"):  # absent: none
            if not out[key]:
                del out[key]
        for key in ("requests_scheduled", "requests_not_sent"):  # open loop only
            if out[key] is None:
                del out[key]
        for key in CACHE_FIELDS:  # only a run that reused cached tokens has them
            if out[key] is None:
                del out[key]
        if not out["metrics"]:
            del out["metrics"]
        if out["slo"] is None:
            del out["slo"]
        for key in ("percentiles", "trimmed"):  # only when asked for
            if out[key] is None:
                del out[key]
        if out["draft_n"] is None:  # no speculation: the level keeps the shape of files written before
            for key in ("draft_n", "draft_n_accepted", "acceptance", "drafted_per_output_token"):
                del out[key]
        if out["reasoning_tokens"] is None:  # no reasoning: likewise
            for key in ("reasoning_tokens", "reasoning_share", "ttfa_ms"):
                del out[key]
        if out["texts"] is None:  # a generation API: likewise
            for key in ("texts", "texts_per_s", "input_tok_s"):
                del out[key]
        if not client_load:
            for key in ("loop_lag_p99_ms", "loop_lag_max_ms", "client_cpu_fraction"):
                del out[key]
        return out


# A level's `stopped_reason` when run.json had no finished summary of it but requests.jsonl has its
# records: the run was killed (kill -9, a crash) while the level ran; summarised from its records
# by a reader (results/unfinished.py).
KILLED_DURING_LEVEL = "incomplete: the run was killed during this level"


# --rate inf: a level whose requests all leave at once. JSON has no infinity (run.json is written
# with allow_nan=False), so run.json stores it as this string wherever a rate is (a level's "level",
# "rate", the verdict's levels and "saturated_at", the config's "rates"): `json_safe` on writing,
# `read_rates` on reading (results/reader.py), so every reader sees math.inf again.
UNBOUNDED_RATE = "inf"
_RATE_KEYS = frozenset({"level", "rate", "rates", "saturated_at"})


def json_safe(value: Any) -> Any:
    """`value` (JSON-like) with every infinite float written as "inf" (or "-inf")."""
    if isinstance(value, float) and math.isinf(value):
        return UNBOUNDED_RATE if value > 0 else "-" + UNBOUNDED_RATE
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def read_rates(value: Any, key: str | None = None) -> Any:
    """run.json's content as read, with "inf" made math.inf again where a rate is (`_RATE_KEYS`)."""
    if isinstance(value, dict):
        return {k: read_rates(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [read_rates(v, key) for v in value]
    if value == UNBOUNDED_RATE and key in _RATE_KEYS:
        return math.inf
    return value


def is_open_loop(doc: Mapping[str, Any]) -> bool:
    """Whether a run document's levels are request rates (open loop) rather than concurrencies.

    The one rule every reader uses: the run's config says `mode = "rate"`.
    """
    config = doc.get("config")
    return isinstance(config, Mapping) and config.get("mode") == "rate"


class SloJudgement(msgspec.Struct, frozen=True):
    """A level judged against --slo as run.json stores it (analysis/slo.py `SloLevel`): the figures
    the tables show; None where a file lacks one."""

    attainment: float | None = None
    passed: bool = False
    goodput_req_s: float | None = None
    goodput_tok_s: float | None = None
    most_missed: str | None = None
    ratio: dict[str, float | None] = {}  # per target, the value over it at the attainment quantile


class SloTargets(msgspec.Struct, frozen=True):
    """--slo as the run's config stores it: latency target (ms) by name, the share that must meet them."""

    targets_ms: dict[str, float] = {}
    attainment: float = 0.0


class EnergyFigures(msgspec.Struct, frozen=True):
    """A level's energy by one source, as run.json stores it (analysis/energy.py)."""

    source: str | None = None
    seconds: float | None = None
    energy_j: float | None = None
    j_per_token: float | None = None
    net_j_per_token: float | None = None
    tokens_per_j: float | None = None
    mean_w: float | None = 0


class WorkerPart(msgspec.Struct, frozen=True):
    """One --workers process's part of a level (run.json's per-level "workers")."""

    worker: int | None = None
    died_at_s: float | None = None
    stopped_reason: str | None = None
    lost: int = 0
    rate_after: float | None = None
    concurrency_after: int | None = None


class Level(LevelSummary, frozen=True, kw_only=True):
    """A level's summary as run.json holds it, with its --workers parts (a run by worker processes)."""

    workers: list[WorkerPart] | None = None
    energy: list[dict[str, Any]] | None = None  # per source (analysis/energy.py); absent without counters
    environment_changed: list[str] | None = None  # what changed in the machine during the level
    # The machine's samples during the level as stored (core.environment.samples_from reads them,
    # skipping unreadable ones); absent without --environment.
    environment: Any = None
    # A run of request classes: the class the level sent and its phase ("alone" or "together");
    # absent from other runs.
    request_class: str | None = None
    phase: str | None = None

    @property
    def energy_figures(self) -> list[EnergyFigures]:
        """`energy` typed, per source ([] without counters)."""
        return msgspec.convert(self.energy or [], list[EnergyFigures], strict=False)

    @property
    def headline_energy(self) -> EnergyFigures | None:
        """The figures the tables, the report and the grid show of a level: its "total" source (cpu +
        gpu), else its only one; None without counters (the per-source lines say the rest)."""
        figures = self.energy_figures
        return next((e for e in figures if e.source == "total"), figures[0] if len(figures) == 1 else None)

    @property
    def machine_changed(self) -> bool:
        """Whether anything changed in the machine during the level (`environment_changed` not empty)."""
        return bool(self.environment_changed)

    @property
    def slo_judgement(self) -> SloJudgement | None:
        """`slo` typed (None: the level was not judged)."""
        return msgspec.convert(self.slo, SloJudgement, strict=False) if self.slo else None


class OpenLoopVerdict(msgspec.Struct, frozen=True):
    """An open-loop level judged alone (analysis/open_loop.py): what was offered and served, the
    backlog's growth and the verdict ("keeps_up", "at_limit", "overloaded", "too_short")."""

    level: int | float
    verdict: str
    offered_rate: float | None = None
    served_rate: float | None = None
    requests_ok: int = 0
    latency_first_ms: float | None = None
    latency_last_ms: float | None = None
    backlog_grew: bool = False
    peak_in_flight: int | None = None
    queue_wait_max_ms: float | None = None


class LevelVerdict(msgspec.Struct, frozen=True):
    """A level of the saturation verdict (analysis/saturation.py, analysis/occupancy.py)."""

    level: int | float
    requests: int = 0
    queued: int = 0
    queued_share: float = 0.0
    queue_wait_ms: Distribution | None = None
    queued_wait_ms: Distribution | None = None  # the queued requests' waits only
    queue_cause: str | None = None  # why they waited: "slots", "prefill", "outside", ... (analysis/saturation.py)
    slot_wait_ms: Distribution | None = None  # their waits while every slot was busy
    peak_deferred: float | None = None
    peak_busy_slots: int | None = None
    batching_gain: float | None = None
    evidence: str | None = None
    slot_queued: int | None = None
    held_outside: int | None = None
    held_outside_max_ms: float | None = None
    open_loop: OpenLoopVerdict | None = None  # open loop only; absent from files before it


class Verdict(msgspec.Struct, frozen=True):
    verdict: list[str] = []
    levels: list[LevelVerdict] = []
    total_slots: int | None = None
    overhead_ms: float | None = None
    saturated_at: int | float | None = None


class MeanSd(msgspec.Struct, frozen=True):
    """analysis.metrics.MeanSd as run.json holds it."""

    n: int
    mean: float
    sd: float | None = None

    def text(self, digits: int = 1) -> str:
        """mean ± sd (sd left out below two values)."""
        return f"{self.mean:,.{digits}f}" + (f" ± {self.sd:,.{digits}f}" if self.sd is not None else "")


class PrefillRow(msgspec.Struct, frozen=True):
    prompt_tokens: int
    requests_ok: int = 0
    requests_failed: int = 0
    prompt_n: MeanSd | None = None
    prompt_n_min: int | None = None
    prompt_n_max: int | None = None
    prompt_ms: MeanSd | None = None
    prompt_tok_s: MeanSd | None = None
    ttft_ms: MeanSd | None = None
    note: str | None = None
    skipped: str | None = None
    # The machine through the step, as a sweep's level has it (`Level`); absent without --environment.
    energy: list[dict[str, Any]] | None = None
    environment_changed: list[str] | None = None
    environment: Any = None


class DepthRow(msgspec.Struct, frozen=True):
    depth: int
    requests_ok: int = 0
    requests_failed: int = 0
    prompt_n: MeanSd | None = None
    decode_tok_s: MeanSd | None = None
    change: float | None = None
    reference_depth: int | None = None
    note: str | None = None
    skipped: str | None = None
    # The machine through the step, as a sweep's level has it (`Level`); absent without --environment.
    energy: list[dict[str, Any]] | None = None
    environment_changed: list[str] | None = None
    environment: Any = None


class PrefillSection(msgspec.Struct, frozen=True):
    rows: list[PrefillRow] = []
    n_ctx: int | None = None


class DepthSection(msgspec.Struct, frozen=True):
    rows: list[DepthRow] = []
    n_ctx: int | None = None


class SlotCycle(msgspec.Struct, frozen=True):
    """One save -> forget -> restore -> next turn cycle of `loadgen slots` (analysis/slots.py
    `CycleFigures`, its verdict and why); the server's fields named as it names them."""

    slot: int
    verdict: str
    why: str = ""
    requests_ok: int = 0  # of its three turns (turn 1, turn 2 after the restore, the control)
    prompt_tokens: int | None = None  # turn 1's prompt_n + cache_n: the saved prompt
    n_saved: int | None = None
    n_written: int | None = None
    save_ms: float | None = None
    n_restored: int | None = None
    n_read: int | None = None
    restore_ms: float | None = None
    cache_n: int | None = None  # turn 2's, after the restore
    ttft_ms: float | None = None
    control_cache_n: int | None = None  # the same turn 2 on the erased slot: re-processed
    control_ttft_ms: float | None = None
    file_bytes: int | None = None  # read from --slot-save-dir; absent: n_written stands for it
    bytes_per_token: float | None = None


class WakeCycle(msgspec.Struct, frozen=True):
    """One idle -> sleep -> wake cycle of `loadgen wake` (run/wake.py): `concurrency` requests on the
    awake server (warm), the wait until /props said `is_sleeping`, the same number sent at once to
    the sleeping server (cold, the first of them woke it). TTFTs are the client's; prompt_ms the
    server's own (its prefill, which a wake does not lengthen: the load is outside it)."""

    cycle: int
    slept: bool  # /props said is_sleeping before the cold requests were sent
    slept_after_s: float | None = None  # from the warm requests' end to is_sleeping seen (polled)
    warm_ttft_ms: float | None = None  # median over the warm requests that succeeded
    cold_ttft_ms: float | None = None  # median over the cold ones
    cold_first_ttft_ms: float | None = None  # the cold request that answered first
    warm_prompt_ms: float | None = None  # the server's prefill, median
    cold_prompt_ms: float | None = None
    # The part of TTFT that was not the server's prefill (TTFT less prompt_ms, median): a reload adds
    # to it, while the prefill's own spread (large on a busy machine) does not enter it.
    warm_wait_ms: float | None = None
    cold_wait_ms: float | None = None
    awake_after: bool | None = None  # /props said awake once the cold requests were answered
    requests_ok: int = 0  # requests of the cycle (warm and cold) that succeeded
    failed: int = 0  # requests of the cycle (warm or cold) that failed
    error: str | None = None  # the first failure, as recorded


class WakeSection(msgspec.Struct, frozen=True):
    """A `loadgen wake` target: its cycles and what they say (analysis/wake.py)."""

    rows: list[WakeCycle] = []
    concurrency: int = 1
    idle_s: float = 0.0
    wakes: int = 0  # cycles in which the server slept and woke
    wake_ms: float | None = None  # median over the wakes of the cold wait less the warm one (WakeCycle)
    verdict: str | None = None
    why: str = ""


class SlotsSection(msgspec.Struct, frozen=True):
    """A `loadgen slots` target: its cycles, the background load they ran under (`concurrency`
    plain requests on the other slots; 0: none), and the figures over the cycles."""

    rows: list[SlotCycle] = []
    concurrency: int = 0
    forget: str = "erase"
    verdict: str | None = None
    by_verdict: dict[str, int] = {}
    save_ms: float | None = None
    restore_ms: float | None = None
    bytes_per_token: float | None = None
    ttft_restored_ms: float | None = None
    ttft_control_ms: float | None = None
    background_ok: int = 0
    background_failed: int = 0


class SoakWindow(msgspec.Struct, frozen=True):
    """One window of a soak (analysis/soak.py `SoakWindow`): seconds since the soak's start, by completion time."""

    start_s: float
    end_s: float
    requests_ok: int = 0
    requests_failed: int = 0
    errors_by_kind: dict[str, int] = {}
    output_tokens: int = 0
    throughput_tok_s: float = 0.0
    # --slo (absent without): requests judged, the good ones, good / judged, good per second
    judged: int | None = None
    good: int | None = None
    attainment: float | None = None
    goodput_req_s: float | None = None
    goodput_tok_s: float | None = None
    # The machine under it (analysis/soak_machine.py; absent: not sampled in it, or an older run)
    environment_changed: list[str] | None = None
    energy: list[dict[str, Any]] | None = None  # per source (analysis/energy.py)


class SoakAttainment(msgspec.Struct, frozen=True):
    """A soak judged against --slo (analysis/soak.py `SoakAttainment`): overall, and the attainment
    of the first and last k full windows with the test of its fall."""

    required: float
    judged: int
    good: int
    attainment: float | None = None
    passed: bool = False
    goodput_req_s: float = 0.0
    goodput_tok_s: float = 0.0
    first_attainment: float | None = None
    last_attainment: float | None = None
    attainment_change: float | None = None
    falling_p: float | None = None
    falling: bool | None = None


class SoakSection(msgspec.Struct, frozen=True):
    duration_s: float
    requests_ok: int
    requests_failed: int
    throughput_tok_s: float
    error_free_s: float
    longest_error_free_s: float
    errors_by_kind: dict[str, int] = {}
    offered_req_s: float | None = None  # absent from files written before it
    first_throughput_tok_s: float | None = None
    last_throughput_tok_s: float | None = None
    drift: float | None = None
    drift_significant: bool | None = None
    drift_windows: int | None = None  # k: the first and last k full windows are compared
    window_s: float | None = None
    windows: list[SoakWindow] = []
    slo: SoakAttainment | None = None  # --slo

    def changed_windows(self) -> list[tuple[int, SoakWindow]]:
        """(number from 1, window) of each window the machine changed during (analysis/soak_machine.py)."""
        return [(i, w) for i, w in enumerate(self.windows, 1) if w.environment_changed]

    def drift_compared(self) -> set[int]:
        """The numbers (from 1) of the windows the drift compares: the first and last k full ones
        (analysis/soak.py `summarize_tally`)."""
        k, length = self.drift_windows or 0, self.window_s or 0.0
        full = [i for i, w in enumerate(self.windows, 1) if w.end_s - w.start_s >= length * 0.999]
        return set(full[:k] + full[-k:]) if k and len(full) >= 2 else set()


class Server(msgspec.Struct, frozen=True):
    total_slots: int | None = None
    metrics_enabled: bool = False
    props: dict[str, Any] | None = None
    models: list[Any] | None = None  # the ids its /v1/models listed (client/probe.py), as stored
    # Whether the server drafts tokens, as its /slots said (client/probe.py `server_speculates`);
    # None: it did not say (no /slots, another server, a file written before).
    speculative: bool | None = None


class ClassSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A request class as run.json's config "classes" holds it (core/request_class.py `to_dict`, in
    its order: compare shows a class as the file has it)."""

    name: str
    prompt_tokens: str | None = None
    n_predict: str
    seed: int = 0
    shapes: int = 0
    concurrency: int = 1
    rate: float | None = None
    requests: int = 0
    slo: str | None = None


class ClassInterference(msgspec.Struct, frozen=True):
    """How one class fared beside the others (analysis/interference.py `Interference`): the
    figure compared (TTFT, else latency), its p50 alone and together, ms; the class whose work held
    the slots and what of it (prefills or answers); the one line."""

    request_class: str
    metric: str
    alone_p50_ms: float | None = None
    together_p50_ms: float | None = None
    slowdown: float | None = None
    held_by: str | None = None
    held_with: str | None = None
    line: str = ""


class DatasetFit(msgspec.Struct, frozen=True):
    """--n-predict dataset: the sampled entries, and of them those skipped on this target because
    prompt + answer is longer than its per-slot context (run/dataset_answers.py)."""

    entries: int
    skipped: int


class LengthsChanged(msgspec.Struct, frozen=True):
    """Prompt lengths loadgen had to change on this target: `floored` of `requests` (a replayed
    trace's prompts too short to hold the salt) raised to `floor_tokens`, the shortest prompt this
    server's tokenizer allows (run/trace_prompts.py). Each such record keeps the asked length in
    `prompt_tokens_target`; its `prompt_n` is what was sent."""

    floored: int
    requests: int
    floor_tokens: int


class RouterModel(msgspec.Struct, frozen=True):
    """One model's requests behind a router over a --models run (analysis/router.py ModelFigures)."""

    model: str
    requests: int = 0
    ok: int = 0
    failed: int = 0
    loads: int = 0  # loads seen happening (docs/router.md)
    cold_load_ms_p50: float | None = None  # of the requests that waited for a load: TTFT less prefill
    waited: int = 0  # requests that waited for a load of their model


class RouterSummary(msgspec.Struct, frozen=True):
    """A --models run's router, per target: each model's figures and the thrash verdict (docs/router.md)."""

    models_max: int | None = None  # the router's --models-max (/props max_instances)
    models: list[RouterModel] = []
    thrash: bool | None = None  # None: no requests, no verdict
    verdict: str | None = None


class Target(msgspec.Struct, frozen=True):
    label: str
    levels: list[Level] = []
    url: str | None = None
    server: Server | None = None
    error: str | None = None
    verdict: Verdict | None = None
    prefill: PrefillSection | None = None
    depth: DepthSection | None = None
    soak: SoakSection | None = None
    slots: SlotsSection | None = None  # a `loadgen slots` run
    wake: WakeSection | None = None  # a `loadgen wake` run
    interference: list[ClassInterference] | None = None  # a run of request classes
    dataset: DatasetFit | None = None  # a dataset-answers run
    lengths_changed: LengthsChanged | None = None  # prompts loadgen lengthened (absent: none)
    router: RouterSummary | None = None  # a --models run: its router's models and verdict

    def section(self, kind: RunKind) -> PrefillSection | DepthSection | SoakSection | SlotsSection | WakeSection | None:
        """This target's section of a run kind without levels (None for a sweep)."""
        name = kind.kind.section  # core/kinds.py: the section a kind without levels writes
        return getattr(self, name) if name in ("prefill", "depth", "soak", "slots", "wake") else None

    def level(self, level: int | float) -> Level | None:
        return next((lv for lv in self.levels if lv.level == level), None)

    def machine_levels(self) -> list[MachineLevel]:
        """Every level the machine was read through, whatever the run's kind: a sweep's or soak's
        levels (named by their level), a prefill's or depth's steps (by their size in tokens)."""
        out = [MachineLevel(str(lv.level), lv.environment, lv.environment_changed, lv.energy) for lv in self.levels]
        out += [MachineLevel(str(r.prompt_tokens), r.environment, r.environment_changed, r.energy)
                for r in (self.prefill.rows if self.prefill else [])]
        out += [MachineLevel(str(r.depth), r.environment, r.environment_changed, r.energy)
                for r in (self.depth.rows if self.depth else [])]
        return out


class MachineLevel(msgspec.Struct, frozen=True):
    """A level or step as the drift guard reads it (analysis/env_drift.py): its name, its machine
    samples as stored, and what changed during it."""

    name: str
    environment: Any = None
    environment_changed: list[str] | None = None
    energy: list[dict[str, Any]] | None = None

    @property
    def energy_figures(self) -> list[EnergyFigures]:
        """`energy` typed, per source ([] without counters)."""
        return msgspec.convert(self.energy or [], list[EnergyFigures], strict=False)


class WorkloadReplay(msgspec.Struct, frozen=True):
    """`loadgen replay`'s trace as the config's workload names it (run/trace_replay.py `source`)."""

    trace: Any = None
    scale_lengths: Any = None


class WorkloadSpec(msgspec.Struct, frozen=True):
    """The config's drawn workload (core/workload.py `to_dict`: the lengths as written) or replay."""

    prompt_tokens: Any = None
    n_predict: Any = None
    replay: WorkloadReplay | None = None


class CacheMode(msgspec.Struct, frozen=True):
    """A cache mode as run.json's config says it (core/cache_mode.py `to_dict`): a shared prefix's
    groups and token counts, or a multi-turn run's users and turns; None where the mode has none."""

    kind: str | None = None  # "shared_prefix" or "multi_turn"
    cache_prompt: bool = False
    groups: int | None = None
    prefix_tokens: int | None = None
    prompt_tokens: int | None = None
    users: int | None = None
    turns: int | None = None

    @property
    def shape(self) -> str:
        """What the mode sends, in words (the table's title and compare's refusal both say it)."""
        if self.kind == "shared_prefix":
            return (f"{self.groups} group(s) sharing a {self.prefix_tokens}-token prefix, "
                    f"prompts of {self.prompt_tokens} tokens")
        if self.kind == "multi_turn":
            return f"{self.users} users × {self.turns} turns"
        return str(self.kind)


class CapacitySearchConfig(msgspec.Struct, frozen=True):
    """A capacity run's search settings as run.json's config "capacity" holds them (analysis/
    capacity_search.py `CapacitySettings.to_dict`); every field is written, none defaulted here."""

    by: str
    max_level: int | float
    start: int | float
    repeat: int
    noise: float
    budget_requests: int | None = None
    budget_s: float | None = None
    hold_s: float | None = None  # --hold (2026-12-05 on); None: a run before it, a fresh run as long as a level
    at_least: bool = False  # --at-least (2026-12-06 on: tune's screen against its bar); absent before it


class Config(msgspec.Struct, frozen=True):
    mode: str = "concurrency"
    # What two runs must share to be compared (analysis/compare.py CONFIG_MUST_MATCH), as stored;
    # None where a file lacks one. A temperature keeps the number it was written as (0 stays 0).
    api: str | None = None
    stream: bool | None = None
    prompt: Any = None  # the prompt text, or a file's description
    n_predict: int | None = None
    ignore_eos: bool | None = None
    temperature: int | float | None = None
    percentiles: list[float] | None = None  # --percentiles: the chosen ones (levels' "percentiles")
    trim: str | None = None  # --trim: "10%" or "5s" of each level's start and end left out of its figures
    slo: dict[str, Any] | None = None  # --slo: the targets and attainment the levels were judged by
    records: str = "all"  # --records: which request records requests.jsonl kept (all, errors, none)
    workload: dict[str, Any] | None = None  # a drawn workload or a replay (core/workload.py)
    cache: dict[str, Any] | None = None  # a cache mode (core/cache_mode.py); None: a normal run, cache off
    cache_prompt: bool = False  # the run sent cache_prompt: true (a cache mode's run)
    classes: list[ClassSpec] | None = None  # a run of request classes (core/request_class.py)
    environment: bool = True  # False: the run was told not to record the machine (--no-environment)
    # The saturation rule the verdict was drawn with (analysis/saturation.py; `analyze` draws it again).
    knee_gain: float | None = 0.10
    knee_latency: float | None = 0.50
    arrival_seed: int | None = None  # open loop: the arrival schedule's seed (a level's repeat k draws seed + k)
    capacity: CapacitySearchConfig | None = None  # a capacity run's search settings (schema 4 on)
    lora_mix: str | None = None  # --lora-mix: adapter ids (and none) with their weights (core/lora_mix.py)
    models: str | None = None  # --models: a router's model ids with their weights (core/model_mix.py)

    @property
    def workload_spec(self) -> WorkloadSpec | None:
        """`workload` typed (None: fixed-shape requests)."""
        return None if self.workload is None else msgspec.convert(self.workload, WorkloadSpec, strict=False)

    @property
    def slo_targets(self) -> SloTargets | None:
        """`slo` typed (None: no --slo)."""
        return msgspec.convert(self.slo, SloTargets, strict=False) if isinstance(self.slo, dict) else None

    @property
    def cache_mode(self) -> CacheMode | None:
        """`cache` typed (None: a normal run)."""
        return None if self.cache is None else msgspec.convert(self.cache, CacheMode, strict=False)


class RunDocument(msgspec.Struct, frozen=True):
    """A run as its readers see it; `of` makes one of run.json's content."""

    targets: list[Target]
    kind: RunKind = RunKind.SWEEP
    complete: bool = True
    config: Config | None = None
    started_utc: str | None = None
    command: list[str] | None = None  # the argv that made the run (before schema 4, capacity's settings)
    # The machine's fingerprint as stored (core.environment.fingerprint_from reads it: None when
    # absent or unreadable); absent from runs before it was recorded.
    environment: Any = None

    @property
    def open_loop(self) -> bool:
        """Levels are request rates, not concurrencies (config mode "rate": core.rundoc.is_open_loop)."""
        return self.config is not None and self.config.mode == "rate"

    @classmethod
    def of(cls, doc: RunDocument | dict[str, Any]) -> RunDocument:
        """The typed document of run.json's content (a document already typed is returned as it is).
        A content that does not fit (a hand-edited or damaged file) is a `ResultsError`: one line."""
        if isinstance(doc, RunDocument):
            return doc
        try:
            return msgspec.convert(doc, cls, strict=False)
        except msgspec.ValidationError as exc:
            reason = str(exc).splitlines()[0] if str(exc) else "it does not fit the run document"
            raise ResultsError(f"run.json is damaged or not written by this loadgen ({reason})") from None
