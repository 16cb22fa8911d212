"""The run.json schema: its name and version, the files of a results directory, and the typed shape
every reader may rely on (msgspec Structs; a level is `core.rundoc.LevelSummary`, the same type
the writer stores).

Version history (SCHEMA_VERSION):
    1  closed loop only: levels keyed by "concurrency"; no "level"/"rate" per level, no streaming
       fields, no config "mode"/"stream". Still read: `reader.upgrade_v1` fills those in.
    2  "level" (a concurrency, or a request rate) and "rate" per level; open loop (config "mode":
       "rate"), streaming figures, schedule lag, and per level the client's own load
       (loop_lag_p99_ms, loop_lag_max_ms, client_cpu_fraction); per target "read_clock".
       Added since, without a bump (older files lack them, readers default them): per level
       "concurrency_reached", "connections_opened", "connect_ms"; config "stagger_s"; per record
       (requests.jsonl) "connect_us", "tls_us"; config "workers" and, in a run by worker
       processes, per level "workers" (each process's part and load).
    3  per level "requests_lost" (absent: none): requests in flight in a --workers process that
       died, records of error kind "lost", counted apart from ok, failed and cancelled, so a reader
       of version 2 would miss them in a level's total; per level "workers", a dead process's
       "died_at_s", "lost" and "concurrency_after" (or "rate_after").
       Added since, without a bump: per verdict level "queue_cause", "evidence", "slot_queued",
       "slot_wait_ms", "held_outside", "held_outside_max_ms", "held_outside_longest_s", "scrapes",
       "unheld_longest_s", "outside_wait_mean_ms", "batch_queued", "batch_wait_max_ms"
       (analysis/occupancy.py); per probe sample
       (probe.jsonl) "scrape_us"; per level "prompt_n" and "predicted_n" (token distributions),
       per record "n_predict_target", config "workload" (core/workload.py, run/trace_replay.py);
       per level "cache_n", "cache_hit_ratio", "ttft_cache_hit_ms", "ttft_cache_miss_ms",
       "prefill_saved_ms" (only when a token was reused, analysis/cache.py), config "cache" and
       "cache_prompt" true (a cache mode, core/cache_mode.py); per level "metrics" (absent: none), the distributions of
       metrics registered beyond the built-in ones (analysis/metric_defs.py), by name.
       Added since, without a bump (docs/environment.md): run "environment" (the machine's
       fingerprint, core.environment.Fingerprint), per level "environment" (its samples),
       "environment_changed" (what changed during it) and "energy" (analysis/energy.py); later the
       same in prefill, depth and soak runs (run "environment"; per prefill/depth row
       "environment", "environment_changed", "energy"; a soak's in its one level).
       Later still: per sample "temperatures" (hwmon: chip, sensor, celsius), and the
       fingerprint's "boot" (label -> the flags and boot decisions of a server `loadgen grid`
       started, core.environment.ServerBoot); absent from older runs, which read as before.
       Later still (issue 52): per sample "mac" (a Mac's power source, Low Power Mode, CPU speed
       limit and thermal warning, core.environment.MacPower) and the fingerprint's "mac" (chip,
       performance and efficiency cores, memory, macOS, core.environment.MacMachine); null off a Mac.
       Added since, without a bump (docs/sweep.md): config "percentiles" and per level "percentiles"
       (--percentiles: metric key -> {"p95": ms, ...}); config "trim" and per level "trimmed"
       (--trim: the records its figures left out, core.rundoc.LevelTrim).
       --rate inf: a level's "level" and "rate", the config's "rates" (and the verdict's levels)
       may be the string "inf" (JSON has no infinity; core.rundoc.json_safe / read_rates), and a
       record's or probe sample's "level" too; `load_run_dict` reads them back as math.inf.
       Added since, without a bump (docs/workloads.md): config "classes", per level "request_class"
       and "phase", per target "interference" (a run of request classes); per record
       "request_class"; per target "dataset" (entries and skipped, --n-predict dataset); config
       "environment" false (--no-environment; absent: on).
       Added since, without a bump (docs/environment.md): per soak window ("soak.windows[]")
       "environment_changed" and "energy" (the machine under it, analysis/soak_machine.py); a soak's
       level "environment" now holds each window's last sample and its change samples (at most
       100), not every sample. Absent from older runs, which read as before.
       Added since, without a bump (issue 46): per open-loop level "requests_scheduled" and
       "requests_not_sent" (core.rundoc.LevelSummary; absent in closed loop and older runs);
       per level "answers_cut" and "answers_short" (answers with fewer tokens than asked, stopped on
       the context limit or otherwise; analysis/cut_answers.py; absent: none);
       per target "lengths_changed" (floored, requests, floor_tokens: a replayed trace's prompts
       too short to hold the salt, raised; core.rundoc.LengthsChanged; absent: none changed).
       Added since, without a bump (docs/lora.md): config "lora_mix" (--lora-mix's adapters and
       weights) and per record "lora" (the adapter asked) and "lora_applied" (what the server said it
       applied); absent or null in a run without a mix.
       Added since, without a bump (docs/router.md): config "models" (--models's router model ids
       and weights) and per record "model" (the model the request named); absent or null without;
       per target "router" (core.rundoc.RouterSummary: models_max, per model requests, ok, failed,
       loads, cold_load_ms_p50, waited, and the thrash verdict; absent without --models).
    4  "kind" names the command that made the run (core.rundoc.RunKind): "capacity", "replay",
       "prefix", "chat" and "cache-capacity" runs, which said "sweep" before, say so (their levels
       read as a sweep's); a capacity run's search settings are in config "capacity" (by,
       max_level, start, repeat, noise, budget_requests, budget_s), read from "command" before.
       A reader of version 3 would take those kinds for runs without levels.
       Added since, without a bump (issue 46): config "capacity" "hold_s" (--hold, the fresh run a
       rate's answer must hold on; absent: a run before it, judged as long as a level).
       Added since, without a bump (issue 50): per level "texts", "texts_per_s", "input_tok_s" and
       config "items" (--api embeddings or rerank only; absent otherwise); record error kinds
       "embedding_mismatch" and "rank_mismatch" (analysis/embedding_check.py).
       Added since, without a bump (issue 50, docs/request-features.md): config "json_schema",
       "grammar", "tools" (how many offered) and "tool_choice" (absent: not asked); per record
       "output_valid" and "tool_calls", error kind "invalid_output"; per level metrics
       "output_valid" (count: answers judged, mean: the validity share) and "tool_calls".
Bump the version when a field readers rely on changes meaning or goes away; adding fields does not
need it (readers ignore unknown fields).
"""

from __future__ import annotations

from typing import Any

import msgspec

from ..core.rundoc import Distribution, LevelSummary, OpenLoopVerdict  # one shape of an open-loop level's verdict

SCHEMA = "loadgen.run"
SCHEMA_VERSION = 4
READABLE_VERSIONS = (1, 2, 3, 4)
RUN_FILE = "run.json"
CAPACITY_FILE = "capacity.json"  # `loadgen capacity`'s answer, beside its run.json
CACHE_CAPACITY_FILE = "cache-capacity.json"  # `loadgen cache-capacity`'s result, beside its k-K/ runs
REQUESTS_FILE = "requests.jsonl"
PROBE_FILE = "probe.jsonl"


class LevelVerdict(msgspec.Struct):
    level: int | float
    requests: int
    queued: int
    queued_share: float
    queue_wait_raw_ms: Distribution | None = None
    queue_wait_ms: Distribution | None = None
    queued_wait_ms: Distribution | None = None
    peak_deferred: float | None = None
    peak_busy_slots: int | None = None
    batching_gain: float | None = None
    failure_share: float = 0.0
    queue_cause: str | None = None  # "slots", "prefill", "outside", "too_short", "unknown" (analysis/saturation.py)
    evidence: str | None = None  # "records" or "scrapes"
    slot_queued: int | None = None
    slot_wait_ms: Distribution | None = None
    held_outside: int | None = None
    held_outside_max_ms: float | None = None
    open_loop: OpenLoopVerdict | None = None  # open loop only; absent from files before it


class Verdict(msgspec.Struct):
    verdict: list[str]
    levels: list[LevelVerdict]
    total_slots: int | None = None
    overhead_ms: float | None = None
    saturated_at: int | float | None = None


class Server(msgspec.Struct):
    props: dict[str, Any] | None = None
    metrics_enabled: bool = False
    total_slots: int | None = None
    speculative: bool | None = None  # absent from files written before it


class Target(msgspec.Struct):
    label: str
    levels: list[LevelSummary] = []
    url: str | None = None
    server: Server | None = None
    error: str | None = None
    read_clock: str | None = None
    verdict: Verdict | None = None


class Config(msgspec.Struct, frozen=True):
    knee_gain: float = 0.10
    knee_latency: float = 0.50
    mode: str = "concurrency"


class RunFile(msgspec.Struct):
    """What run.json must hold for report, analyze, compare, gate and export to read it.

    Checked on load so that a damaged or hand-edited file is one line for the user, not a traceback
    in whichever reader trips over it first. Unknown fields are allowed (newer writers add some).
    """

    targets: list[Target]
    config: Config = Config()
    kind: str = "sweep"
    complete: bool = False
