"""What every layer reads of a grid document (grid.json): the grid, its cells and each cell's runs.

`GridDocument` is grid.json's content as msgspec Structs: results/grid_file.py converts the file
into it once at the edge (`load_grid`: a damaged file is one line, `ResultsError`) and writes it
back (`write_grid`: field order = file order); `loadgen grid` builds it and adds each run's
`GridRun`; the readers (the grid table, `analyze`, `report`, crossover) read it by attribute. A
run's fields left unset (None, an empty log tail) are left out of the file, as `loadgen grid`
always wrote them. It lives in core, as core/rundoc.py does, so that analysis/ reads it too.

Fields this loadgen does not know (a newer writer's) are dropped on reading, so a `--resume` by
this loadgen does not keep them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

Measure = Literal["sweep", "prefill", "depth", "capacity", "cache-capacity"]  # what runs against each cell's server


class KvCacheEntry(msgspec.Struct):
    """One `llama_kv_cache: size` line of the boot log (`analysis.bootlog.KvCacheLine`)."""

    size_mib: float | None = None
    cells: int | None = None
    layers: int | None = None
    seqs: int | None = None
    streams: int | None = None
    type_k: str | None = None
    type_v: str | None = None


class MetalEntry(msgspec.Struct, kw_only=True):
    """The Apple GPU of a Metal build's boot log (`analysis.bootlog.MetalDevice`)."""

    name: str | None = None
    gpu_families: list[str] = []
    unified_memory: bool | None = None
    working_set_mib: float | None = None  # recommendedMaxWorkingSetSize, MiB


class BootEntry(msgspec.Struct, kw_only=True):
    """A run's boot-log facts as grid.json holds them (`analysis.bootlog.BootFacts.to_dict`)."""

    n_slots: int | None = None
    n_ctx_slot: int | None = None
    n_seq_max: int | None = None
    n_ctx: int | None = None
    n_ctx_seq: int | None = None
    kv_unified: bool | None = None
    kv_caches: list[KvCacheEntry] = []
    recurrent_mib: float | None = None
    build: str | None = None
    http_threads: int | None = None
    kv_size_mib: float | None = None
    metal: MetalEntry | None = None  # a Metal build's device and working set (absent: none)


class KvEstimateEntry(msgspec.Struct, kw_only=True):
    """`loadgen kv`'s estimate for a cell's flags (MiB, rounded to the hundredth)."""

    kv_mib: float | None = None
    n_ctx: int | None = None
    n_ctx_seq: int | None = None
    cells: int | None = None
    layers: int | None = None
    n_stream: int | None = None
    recurrent_mib: float | None = None
    total_mib: float | None = None
    weights_mib: float | None = None  # the model file's tensors (run/gguf_file.py weights_bytes)


class CapacityEntry(msgspec.Struct, kw_only=True):
    """A `--measure capacity` run's answer, as its capacity.json gives it (kinds/capacity/command.py): the
    highest level that passed (None: none did), the lowest that failed, the levels whose repeats
    disagreed, the binding target, the verdict sentence and what the search cost."""

    by: Literal["concurrency", "rate"] = "concurrency"
    feasible_max: int | float | None = None
    infeasible_min: int | float | None = None
    inconclusive: list[int | float] = []
    binding: str | None = None
    shape: str | None = None
    verdict: str | None = None
    requests: int | None = None
    wall_s: float | None = None

    @property
    def bracket_hi(self) -> int | float | None:
        """The lowest level that did not pass (failed or inconclusive), as the search's bracket has it."""
        above = [lv for lv in (self.infeasible_min, *self.inconclusive) if lv is not None]
        return min(above) if above else None


class CacheCapacityLevelEntry(msgspec.Struct, kw_only=True):
    """One K of a `--measure cache-capacity` run (analysis/cache.py `CapacityLevel`)."""

    k: int
    warm_requests: int = 0
    warm_hit_ratio: float | None = None
    warm_ttft_ms_p50: float | None = None
    rss_mib: float | None = None


class CacheCapacityEntry(msgspec.Struct, kw_only=True):
    """A `--measure cache-capacity` run's result, as its cache-capacity.json gives it
    (kinds/cache_capacity/command.py, analysis/cache.py `CapacitySummary`): the conversations' size, the
    rounds, the server's slots, the cache RAM, bytes per token and server modes it was given, the
    predicted capacity and the K where reuse collapsed (None: not known, or no collapse), each K."""

    conversation_tokens: int
    rounds: int
    slots: int
    cache_ram_mib: float | None = None
    bytes_per_token: float | None = None
    cache_idle_slots: bool | None = None  # the server modes the prediction assumed (None: an older file)
    kv_unified: bool | None = None
    predicted_capacity: int | None = None
    collapse_k: int | None = None
    levels: list[CacheCapacityLevelEntry] = []
    complete: bool = True  # False: the run stopped before its last K (written since cache-capacity kept the Ks it finished)


class GridRun(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One run of a cell: its repeat number, how it ended (`status` ok, failed, interrupted, with
    the `reason`), its server and where its results are (folders relative to the grid's)."""

    repeat: Annotated[int, msgspec.Meta(ge=1)]
    started_utc: str | None = None
    command: list[str] | None = None  # the server's argv as run
    url: str | None = None
    log: str | None = None
    kv_estimate: KvEstimateEntry | None = None
    kv_estimate_note: str | None = None  # why there is no estimate
    pid: int | None = None
    boot: BootEntry | None = None
    props: dict[str, Any] | None = None  # /props' total_slots, model_alias, model_path, build_info
    run_dir: str | None = None
    measure_exit: int | None = None
    status: str
    reason: str | None = None
    server_exit: int | None = None
    server_gone: bool | None = None
    finished_utc: str | None = None
    log_tail: list[str] = []  # the server log's last lines, when the run failed
    capacity: CapacityEntry | None = None  # --measure capacity: the run's answer
    cache_capacity: CacheCapacityEntry | None = None  # --measure cache-capacity: the run's result

    @property
    def finished(self) -> bool:
        """It ended ok and has its run folder (its run.json may still be unreadable)."""
        return self.status == "ok" and bool(self.run_dir)


class GridCell(msgspec.Struct, kw_only=True):
    id: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]+$")]  # the cell's folder under cells/
    name: str
    params: dict[str, str]
    runs: list[GridRun] = []
    measure_args: list[str] | None = None  # this cell's own options after the grid's (tune: its --start)

    def finished_runs(self) -> list[GridRun]:
        """The runs that ended ok with a run folder, in repeat order."""
        return [r for r in sorted(self.runs, key=lambda r: r.repeat) if r.finished]


class GridParamEntry(msgspec.Struct):
    name: str
    values: list[str]


class GridDocument(msgspec.Struct, kw_only=True):
    """A grid: the server's command-line template, its parameters, what runs against each cell
    and its cells (every combination of the parameters' values)."""

    command: list[str] | str | None = None  # loadgen's command line that started the grid (secrets hidden)
    template: str
    params: list[GridParamEntry]
    repeat: Annotated[int, msgspec.Meta(ge=1)]
    measure: Measure
    measure_args: list[str]
    wait_ready_s: Annotated[float, msgspec.Meta(ge=0)]
    cells: list[GridCell]
    port_range: tuple[int, int] | None = None  # --port-range (first, last); None: any free port
    memory_mib: float | None = None  # --memory: a cell whose weights and KV cache exceed it is not started

    @property
    def param_names(self) -> list[str]:
        return [p.name for p in self.params]
