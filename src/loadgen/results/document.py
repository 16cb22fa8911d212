"""A run document (run.json) as typed records: what output/, analysis/ and cli/ read by attribute.

`RunDocument.of(doc)` converts what `reader.load_run` returned (the checked, upgraded dict) into
msgspec Structs: the run's kind as a `RunKind`, `open_loop` a property (core.rundoc's one rule),
per target its levels (`core.rundoc.LevelSummary` plus the --workers parts), its verdict, and its
prefill, depth or soak section, each typed. Every field a reader may find absent (an older file, a
kind without it) has a default; fields no reader reads are not here and are dropped, so a reader
that must pass run.json on verbatim (the JSON exporter) reads the dict, not this.
"""

from __future__ import annotations

import enum
from typing import Any

import msgspec

from ..core.rundoc import Distribution, LevelSummary


class RunKind(enum.StrEnum):
    """Which command wrote the run (run.json's "kind")."""

    SWEEP = "sweep"
    DEMO = "demo"
    PREFILL = "prefill"
    DEPTH = "depth"
    SOAK = "soak"

    @property
    def has_levels(self) -> bool:
        """Levels and verdicts (a sweep's tables), rather than one section per target."""
        return self in (RunKind.SWEEP, RunKind.DEMO)


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


class LevelVerdict(msgspec.Struct, frozen=True):
    """A level of the saturation verdict (analysis/saturation.py, analysis/occupancy.py)."""

    level: int | float
    requests: int = 0
    queued: int = 0
    queued_share: float = 0.0
    queue_wait_ms: Distribution | None = None
    peak_deferred: float | None = None
    peak_busy_slots: int | None = None
    batching_gain: float | None = None
    evidence: str | None = None
    slot_queued: int | None = None
    held_outside: int | None = None
    held_outside_max_ms: float | None = None


class Verdict(msgspec.Struct, frozen=True):
    verdict: list[str] = []
    levels: list[LevelVerdict] = []
    total_slots: int | None = None
    overhead_ms: float | None = None


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


class PrefillSection(msgspec.Struct, frozen=True):
    rows: list[PrefillRow] = []
    n_ctx: int | None = None


class DepthSection(msgspec.Struct, frozen=True):
    rows: list[DepthRow] = []
    n_ctx: int | None = None


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


class Server(msgspec.Struct, frozen=True):
    total_slots: int | None = None
    metrics_enabled: bool = False
    props: dict[str, Any] | None = None


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

    def section(self, kind: RunKind) -> PrefillSection | DepthSection | SoakSection | None:
        """This target's section of a prefill, depth or soak run (None for a sweep)."""
        return {RunKind.PREFILL: self.prefill, RunKind.DEPTH: self.depth, RunKind.SOAK: self.soak}.get(kind)

    def level(self, level: int | float) -> Level | None:
        return next((lv for lv in self.levels if lv.level == level), None)


class Config(msgspec.Struct, frozen=True):
    mode: str = "concurrency"


class RunDocument(msgspec.Struct, frozen=True):
    """A run as its readers see it; `of` makes one of run.json's content."""

    targets: list[Target]
    kind: RunKind = RunKind.SWEEP
    complete: bool = True
    config: Config | None = None
    started_utc: str | None = None

    @property
    def open_loop(self) -> bool:
        """Levels are request rates, not concurrencies (config mode "rate": core.rundoc.is_open_loop)."""
        return self.config is not None and self.config.mode == "rate"

    @classmethod
    def of(cls, doc: RunDocument | dict[str, Any]) -> RunDocument:
        """The typed document of run.json's content (a document already typed is returned as it is)."""
        if isinstance(doc, RunDocument):
            return doc
        return msgspec.convert(doc, cls, strict=False)
