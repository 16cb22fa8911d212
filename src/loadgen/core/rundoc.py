"""What every layer reads of a run document (run.json): a level's summary, and whether the run is open loop.

`LevelSummary` is the one schema of a level in run.json: analysis/metrics.py computes it, the
results writer stores it (`to_dict`, field order = file order) and results/schema.py checks a file
against it on load. Fields a version-1 file or a damaged one may lack have defaults; the others
must be there for `report`, `export`, `compare` and `gate` to read the file.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec


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
    errors_by_kind: dict[str, int] = {}
    output_tokens: int
    wall_s: float
    throughput_tok_s: float
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

    def to_dict(self, client_load: bool = False) -> dict[str, Any]:
        """The level as run.json holds it; the client-load fields only with `client_load`."""
        out = msgspec.to_builtins(self)
        for key in ("concurrency_reached", "connections_opened"):  # a file written before keeps its shape
            if out[key] is None:
                del out[key]
        if not out["requests_lost"]:
            del out["requests_lost"]
        for key in CACHE_FIELDS:  # only a run that reused cached tokens has them
            if out[key] is None:
                del out[key]
        if not client_load:
            for key in ("loop_lag_p99_ms", "loop_lag_max_ms", "client_cpu_fraction"):
                del out[key]
        return out


# A level's `stopped_reason` when run.json had no finished summary of it but requests.jsonl has its
# records: the run was killed (kill -9, a crash) while the level ran; summarised from its records
# by a reader (results/unfinished.py).
KILLED_DURING_LEVEL = "incomplete: the run was killed during this level"


def is_open_loop(doc: Mapping[str, Any]) -> bool:
    """Whether a run document's levels are request rates (open loop) rather than concurrencies.

    The one rule every reader uses: the run's config says `mode = "rate"`.
    """
    config = doc.get("config")
    return isinstance(config, Mapping) and config.get("mode") == "rate"
