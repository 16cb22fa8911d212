"""Exporters: a results directory's data rewritten for other tools, one exporter per format.

Every exporter has the same shape (`Exporter.render(data) -> [(file name, bytes)]`) and reads the
same `ExportData` (the run document, the request records, the chosen targets and metrics), so adding
a format is adding one class to `EXPORTERS`. Exporters return bytes and touch no file; `write_files`
(or `export`, both at once) is the one writer. The figures come from `analysis.metrics`.

    hgrm   HdrHistogram percentile distribution text, values in ms: <label>-c<level>-<metric>.hgrm
    hlog   one HdrHistogram interval log per metric, one interval per target and level, tagged
           <label>/c<level>/<metric>, values recorded in µs: <metric>.hlog
    csv    requests.csv (every field of every record) and levels.csv (one row per level summary);
           a --models run also router.csv (each target's models behind the router, with its verdict);
           a chat run also turns.csv (its per-turn table, one row per target and turn); a run of
           request classes has request_class and phase after target in both (`request_phases`);
           a prefill or depth run: prefill.csv / depth.csv (its table, one row per length or depth)
    json   levels.json: every level summary with its target and the saturation verdict (a chat run's
           per-turn rows under "turns"); a prefill or depth run: prefill.json / depth.json (its
           table per target)

What a run cannot give is refused in one line (`check_exportable`): histograms of a prefill or depth
run (one request per row, no levels), or of a run that kept no successful request's record
(`--records errors|none`). Records kept that way are exported as kept and said so (`records_note`).
    jsonl, parquet  the records in the other records format (requests.jsonl, requests.parquet)
    trace  the requests as a replayable Mooncake-format trace per target (output/trace_export.py)
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import msgspec
from hdrh.histogram import HdrHistogram
from hdrh.log import HistogramLogWriter

from ..analysis import metric_defs, metrics
from ..analysis.cache import conversation_turns
from ..core import columnar
from ..core.errors import UserError
from ..core.records import RequestRecord, encode_lines
from ..core.request_class import ALONE, TOGETHER
from ..core.rundoc import RunDocument, Target, json_safe
from .cache import kept_records
from .files import ExportFiles, file_safe, write_files
from .kind_view import rows_section, view_of
from .trace_export import TraceExporter

US_PER_MS = 1000  # histograms hold µs (metrics.histogram_ms); hgrm and hlog maxima are shown in ms


def _exported() -> list[metric_defs.Metric]:
    """Every metric --metric can name (analysis/metric_defs.py), in its registration order."""
    return [m for m in metric_defs.all_metrics() if m.export]


def metric_names() -> list[str]:
    """The names --metric takes."""
    return [m.name for m in _exported()]


def _open_loop_names() -> list[str]:
    """Metrics that only an open-loop run has: in closed loop the intended send is the actual one,
    so uncorrected latency is latency (an identical file) and there is no schedule to lag behind."""
    return [m.name for m in _exported() if m.open_loop]


class ExportError(UserError):
    """A request the data cannot satisfy (unknown target or metric); the message is for the user."""


HISTOGRAM_FORMATS = ("hgrm", "hlog")
RECORD_FORMATS = ("jsonl", "parquet")


def records_kept(run: RunDocument | dict[str, Any]) -> str:
    """Which request records the run kept (--records: all, errors or none)."""
    config = RunDocument.of(run).config
    return config.records if config else "all"


def check_exportable(run: dict[str, Any], fmt: str) -> None:
    """Raise ExportError (one line, what to export instead) when the run has nothing `fmt` exports."""
    doc, kept = RunDocument.of(run), records_kept(run)
    kind, view = doc.kind, view_of(doc)
    if view.row_name is not None and fmt in HISTOGRAM_FORMATS:
        raise ExportError(f"a {kind} run has a table per {view.row_name}, "
                          f"not levels to make {fmt} histograms of; export --format csv or json (its table) "
                          "or jsonl/parquet (its records)")
    if kept == "none" and fmt in (*HISTOGRAM_FORMATS, *RECORD_FORMATS):
        raise ExportError(f"this run kept no request records (--records none), so there is no {fmt} to export; "
                          "--format csv or json exports its summaries")
    if kept == "errors" and fmt in HISTOGRAM_FORMATS:
        raise ExportError("this run kept only failed requests' records (--records errors) and the histograms are "
                          "of successful requests; --format csv or json exports its summaries")


def requests_sent(run: RunDocument | dict[str, Any]) -> int:
    """Every request run.json counts (ok and failed), over its levels or table rows."""
    doc = RunDocument.of(run)
    tabled = rows_section(doc) is not None  # a table per target instead of levels
    rows: list[Any] = []
    for target in doc.targets:
        section = target.section(doc.kind)
        rows += getattr(section, "rows", []) if tabled else target.levels
    return sum(row.requests_ok + row.requests_failed for row in rows)


def records_note(data: ExportData, fmt: str) -> str | None:
    """The line that says the records exported are filtered (`--records errors`), or None."""
    kept = records_kept(data.doc)
    if kept == "all" or fmt not in ("csv", *RECORD_FORMATS):
        return None
    what = "only failed requests" if kept == "errors" else "no request records"
    return (f"records: this run kept {what} (--records {kept}): the export has {len(data.records)} of "
            f"{requests_sent(data.doc)} requests; its summaries count every request")


class VerbatimSection(msgspec.Struct, frozen=True):
    """A prefill, depth or slots section as run.json holds it: its rows passed on as written."""

    n_ctx: Any = None
    rows: list[dict[str, Any]] | None = None


class VerbatimTarget(msgspec.Struct, frozen=True):
    """A target as the JSON and CSV exporters pass it on: its level summaries, verdict and sections
    as run.json holds them (each value as written: a stored 0 stays 0, a field the file lacks stays out)."""

    levels: list[dict[str, Any]] | None = None
    verdict: Any = None
    prefill: VerbatimSection | None = None
    depth: VerbatimSection | None = None
    slots: VerbatimSection | None = None

    def section(self, name: str | None) -> VerbatimSection:
        """The section whose rows a kind's exports write (kind_view.rows_section: "prefill", "depth",
        "slots"); empty for another."""
        return (getattr(self, name) if name in ("prefill", "depth", "slots") else None) or VerbatimSection()


class VerbatimRun(msgspec.Struct, frozen=True):
    """run.json as passed on: its targets, and its kind and completeness as the file has them (null
    where it lacks them, where the typed document would say "sweep" and true)."""

    targets: list[VerbatimTarget]
    kind: Any = None
    complete: Any = None


@dataclass(frozen=True)
class ExportData:
    """What every exporter reads: one run, narrowed to the chosen targets and metrics.

    `doc` and `targets` are the typed run (core/rundoc.py), what exporters read by attribute.
    `run` and `verbatim` (each chosen target, in `targets`' order) are run.json's content as read
    (`VerbatimRun`), for what the JSON and CSV exporters pass on verbatim: level summaries, verdicts
    and table rows keep their fields, their order and their numbers as written (a typed float
    would turn a stored 0 into 0.0, a typed default would fill a field the file lacks)."""

    run: VerbatimRun
    records: list[RequestRecord]
    doc: RunDocument
    targets: list[Target]
    verbatim: list[VerbatimTarget]
    metric_names: list[str]

    def records_of(self, label: str, level: int | float | None = None) -> list[RequestRecord]:
        return [r for r in self.records if r.target == label and (level is None or r.level == level)]


def select(run: dict[str, Any], records: list[RequestRecord], target: str | None = None,
           metric: str | None = None) -> ExportData:
    """Narrow a run to one target and/or one metric; raise ExportError naming what exists."""
    doc, verbatim = RunDocument.of(run), msgspec.convert(run, VerbatimRun, strict=False)
    chosen = list(zip(doc.targets, verbatim.targets, strict=True))  # RunDocument.of took every target
    if target is not None:
        labels = [t.label for t, _ in chosen]
        if target not in labels:
            raise ExportError(f"no target {target!r} in this run; it has {', '.join(labels) or 'none'}")
        chosen = [(t, raw) for t, raw in chosen if t.label == target]
    names = metric_names()
    if metric is not None and metric not in names:
        raise ExportError(f"unknown metric {metric!r}; choose one of {', '.join(names)}")
    if not doc.open_loop:
        if metric in _open_loop_names():
            raise ExportError(f"{metric} is an open-loop metric (sweep --rate); in this closed-loop run "
                              "every request left when it was meant to: export latency")
        names = [m for m in names if m not in _open_loop_names()]
    chosen_labels = {t.label for t, _ in chosen}
    kept = [r for r in records if r.target in chosen_labels]
    if metric is None:  # every metric the run has values for (no TTFT without streaming, ...)
        names = [m for m in names if metric_histogram(kept, m).get_total_count()]
    return ExportData(run=verbatim, records=kept, doc=doc, targets=[t for t, _ in chosen],
                      verbatim=[raw for _, raw in chosen], metric_names=[metric] if metric else names)


def metric_histogram(records: Iterable[RequestRecord], metric: str) -> HdrHistogram:
    """An HdrHistogram (µs) of one metric over the records that have it (its per-record definition)."""
    m = metric_defs.get(metric)
    records = list(records)
    if not m.kept(records):
        return metrics.new_histogram()  # closed loop: no schedule; no request reasoned: TTFA is TTFT
    return metrics.histogram_ms(v for r in records for v in m.values(r))


class Exporter(Protocol):
    name: str

    def render(self, data: ExportData) -> ExportFiles:
        """This format's files: their names and contents."""
        ...


def export(name: str, data: ExportData, out_dir: Path) -> list[Path]:
    """Render the `name` format and write its files into out_dir."""
    return write_files(EXPORTERS[name].render(data), out_dir)


class HgrmExporter:
    """HdrHistogram's classic percentile distribution, one file per target × level × metric."""

    name = "hgrm"

    def render(self, data: ExportData) -> ExportFiles:
        files = []
        for target in data.targets:
            label = target.label
            for level in (lv.level for lv in target.levels):
                records = data.records_of(label, level)
                for metric in data.metric_names:
                    histogram = metric_histogram(records, metric)
                    if histogram.get_total_count():
                        files.append((f"{file_safe(label)}-{level_tag(level)}-{metric}.hgrm",
                                      percentile_distribution(histogram)))
        return files


def level_histogram_files(run: dict[str, Any], levels: Iterable[tuple[str, int | float, Any]]) -> ExportFiles:
    """The hgrm files of a run's levels from their streaming aggregates (label, level,
    `analysis.aggregate.LevelAggregate`): the files `HgrmExporter` writes from the same records."""
    open_loop = RunDocument.of(run).open_loop
    names = [m for m in metric_names() if open_loop or m not in _open_loop_names()]
    files = []
    for label, level, aggregate in levels:
        for metric in names:
            if (metric == "schedule_lag" and not aggregate.any_scheduled) or \
                    (metric == "ttfa" and not aggregate.reasoning_counted):
                continue  # as `metric_histogram` (metric_defs' kept_if), from the aggregate's sums
            histogram = aggregate.histogram(metric)
            if histogram.get_total_count():
                files.append((f"{file_safe(label)}-{level_tag(level)}-{metric}.hgrm", percentile_distribution(histogram)))
    return files


def is_hgrm_name(name: str) -> bool:
    """Whether a file name is one HgrmExporter writes (<label>-c<level>-<metric>.hgrm)."""
    pattern = r"^.+-(?:c\d+|r[0-9.e+-]+|rinf)-(?:" + "|".join(map(re.escape, metric_names())) + r")\.hgrm$"
    return re.match(pattern, name) is not None


def percentile_distribution(histogram: HdrHistogram) -> bytes:
    """The .hgrm text of a µs histogram, values in ms."""
    out = io.BytesIO()
    histogram.output_percentile_distribution(out, US_PER_MS)
    text = out.getvalue().decode()
    # hdrhistogram 0.10 scales the mean but not the standard deviation; restate both in ms.
    mean_ms = histogram.get_mean_value() / US_PER_MS
    stddev_ms = histogram.get_stddev() / US_PER_MS
    digits = histogram.significant_figures
    text = re.sub(r"^#\[Mean .*$",
                  f"#[Mean    = {mean_ms:12.{digits}f}, StdDeviation   = {stddev_ms:12.{digits}f}]",
                  text, count=1, flags=re.M)
    return text.encode()


class HlogExporter:
    """HdrHistogram interval logs: one per metric, an interval per target and level.

    Interval times are seconds since the run's first request (the log's BaseTime is the run's start),
    each spanning its level's first send to last completion. Intervals of the same tag can be merged
    with `HistogramLogReader.add_next_interval_histogram`.
    """

    name = "hlog"

    def render(self, data: ExportData) -> ExportFiles:
        origin_ns = min((r.send_ns for r in data.records), default=0)
        return [(f"{metric}.hlog", self._log(data, metric, origin_ns).encode("utf-8")) for metric in data.metric_names]

    def _log(self, data: ExportData, metric: str, origin_ns: int) -> str:
        """The interval log of one metric: an interval per target and level that has values."""
        with io.StringIO(newline="") as f:
            writer = HistogramLogWriter(f)
            writer.output_log_format_version()
            writer.output_comment(f"[loadgen {data.doc.kind}: {metric}, values in µs, "
                                  f"times in s since the first request; started {data.doc.started_utc}]")
            writer.output_legend()
            for target in data.targets:
                for level in (lv.level for lv in target.levels):
                    records = data.records_of(target.label, level)
                    histogram = metric_histogram(records, metric)
                    if not histogram.get_total_count():
                        continue
                    start_s = (min(r.send_ns for r in records) - origin_ns) / 1e9
                    end_s = (max(r.complete_ns for r in records) - origin_ns) / 1e9
                    f.write(interval_line(hlog_tag(target.label, level, metric), histogram, start_s,
                                          max(end_s - start_s, 0.0)))
            return f.getvalue()


def interval_line(tag: str, histogram: HdrHistogram, start_s: float, length_s: float) -> str:
    """One interval of an HdrHistogram log: Tag=<tag>,<start s>,<length s>,<Interval_Max>,<payload>.

    Interval_Max is the histogram's maximum divided by the maxValueUnitRatio, as a real number:
    the Java and .NET writers print max / ratio with three decimals. The hdrh package's writer
    floor-divides it (`//`), which with values in µs and a ratio of 1000 cut every maximum to
    whole ms; so the line is written here, Interval_Max in ms with µs precision. (That writer
    also has no tags; its reader parses the "Tag=<tag>," prefix.)
    """
    max_ms = histogram.get_max_value() / US_PER_MS
    return f"Tag={tag},{start_s:f},{length_s:f},{max_ms:.3f},{histogram.encode().decode('ascii')}\n"


def level_tag(level: int | float) -> str:
    """c4 for concurrency 4, r0.5 for an open-loop rate of 0.5 requests/s."""
    return f"r{level:g}" if isinstance(level, float) else f"c{level}"


def hlog_tag(label: str, level: int | float, metric: str) -> str:
    """<label>/c<level>/<metric> (r<rate> open loop); commas and whitespace would break the log line."""
    safe_label = re.sub(r"[,\s]+", "_", label)
    return f"{safe_label}/{level_tag(level)}/{metric}"


USAGE_FIELDS = ["usage_prompt_tokens", "usage_completion_tokens", "usage_total_tokens"]
REQUEST_FIELDS = [f for f in RequestRecord.__struct_fields__ if f != "usage"] + USAGE_FIELDS
_D = metric_defs
# A level's judgement against --slo (run.json's "slo"), flattened as slo_<field>.
SLO_FIELDS = ("attainment", "passed", "goodput_req_s", "goodput_tok_s", "most_missed", "score")


def level_fields() -> list[str]:
    """levels.csv's columns: the level's counts and each metric's (metric_defs: <key>_<stat>) in the
    order the file has always had, then those of every metric registered beyond the built-in ones."""
    built_in = ["target", "level", "concurrency", "rate", "achieved_rate", "requests_ok", "requests_failed",
                "requests_cancelled", "errors_by_kind", "output_tokens", "wall_s", "throughput_tok_s",
                *_D.LATENCY.columns(), *_D.QUEUE_WAIT.columns(),
                _D.PREDICTED_MS.key, _D.PROMPT_MS.key, _D.DECODE_TOK_S.key, "stopped_reason",
                "queued_share", "peak_deferred", "peak_busy_slots", "batching_gain",
                *(c for m in (_D.TTFT, _D.TPOT, _D.ITL, _D.LATENCY_UNCORRECTED, _D.SCHEDULE_LAG) for c in m.columns()),
                "connections_opened", *_D.CONNECT.columns(), "requests_lost",
                "input_tokens", "request_rate", "total_tok_s", *(f"slo_{k}" for k in SLO_FIELDS),
                "draft_n", "draft_n_accepted", "acceptance", "drafted_per_output_token",
                "reasoning_tokens", "reasoning_share", *_D.TTFA.columns()]
    return built_in + [c for m in _D.all_metrics() if m.name not in _D.BUILT_IN for c in m.columns()]


TRIM_FIELDS = ("head", "tail", "cut_s", "too_short")  # --trim: run.json's per-level "trimmed", as trimmed_<field>
# A level's headline energy (core.rundoc Level.headline_energy: "total", else the only source), as the tables show it.
# Columns as run.json names the fields, the source as energy_source.
ENERGY_COLUMNS = {"source": "energy_source", "energy_j": "energy_j", "mean_w": "mean_w", "j_per_token": "j_per_token",
                  "net_j_per_token": "net_j_per_token", "tokens_per_j": "tokens_per_j"}

# A cache mode's per-level figures (core.rundoc CACHE_FIELDS; analysis/cache.py), as run.json names them.
CACHE_COLUMNS = ("cache_hit_ratio", "cache_n_p50", "cache_n_mean", "ttft_cache_hit_ms_p50", "ttft_cache_hit_ms_p99",
                 "ttft_cache_miss_ms_p50", "ttft_cache_miss_ms_p99", "prefill_saved_ms")


def chosen_fields(run: RunDocument | dict[str, Any]) -> list[str]:
    """levels.csv's columns of what the run chose: --percentiles, <key>_<label> per percentile metric
    (analysis/metric_defs.PERCENTILE_METRICS, e.g. ttft_ms_p99.9); --trim, trimmed_<field>; with energy
    counters, each level's headline energy (ENERGY_COLUMNS); a cache mode's figures (CACHE_COLUMNS);
    environment_changed when the machine changed."""
    doc = RunDocument.of(run)
    config = doc.config
    labels = [_D.percentile_label(q) for q in (config.percentiles if config is not None else None) or ()]
    trimmed = [f"trimmed_{k}" for k in TRIM_FIELDS] if config is not None and config.trim else []
    levels = [lv for t in doc.targets for lv in t.levels]
    energy = list(ENERGY_COLUMNS.values()) if any(lv.headline_energy for lv in levels) else []
    changed = ["environment_changed"] if any(lv.machine_changed for lv in levels) else []
    cache = list(CACHE_COLUMNS) if config is not None and config.cache_mode is not None else []
    return [f"{m.key}_{label}" for m in _D.PERCENTILE_METRICS for label in labels] + trimmed + energy + cache + changed


CLASS_FIELDS = ("request_class", "phase")  # a run of request classes: what tells its rows apart


def has_classes(run: RunDocument | dict[str, Any]) -> bool:
    config = RunDocument.of(run).config
    return config is not None and bool(config.classes)


def with_class_fields(fields: list[str], run: RunDocument | dict[str, Any]) -> list[str]:
    """A CSV's columns, with a run of classes' class and phase right after the target (a class alone
    and beside the others share a concurrency, so without them two rows read the same)."""
    if not has_classes(run):
        return fields
    rest = [f for f in fields if f not in CLASS_FIELDS]
    return rest[:1] + list(CLASS_FIELDS) + rest[1:]


def request_phases(data: ExportData) -> list[str | None]:
    """Each record's phase ("alone" or "together") in a run of classes, None elsewhere. Records carry
    their class, not their phase; a class's levels run one after another (alone, then together), so
    its first n records by send time are its alone level's, n the requests that level counted. None
    for all when the run kept only some records (the counts would not hold)."""
    if not has_classes(data.doc) or not kept_records(data.doc, data.records):
        return [None] * len(data.records)
    phase: dict[int, str] = {}
    for target in data.targets:
        for cls in dict.fromkeys(lv.request_class for lv in target.levels if lv.request_class is not None):
            mine = sorted((i for i, r in enumerate(data.records) if r.target == target.label and r.request_class == cls),
                          key=lambda i: (data.records[i].start_ns, data.records[i].seq))
            alone = sum(lv.requests_ok + lv.requests_failed + lv.requests_cancelled for lv in target.levels
                        if lv.request_class == cls and lv.phase == ALONE)
            phase.update((i, ALONE if k < alone else TOGETHER) for k, i in enumerate(mine))
    return [phase.get(i) for i in range(len(data.records))]


def request_row(r: RequestRecord) -> dict[str, Any]:
    """A record as flat CSV cells: `usage` spread over three columns, chunk gaps space-separated."""
    row = r.to_dict()
    usage = row.pop("usage") or {}
    for name in USAGE_FIELDS:
        row[name] = usage.get(name.removeprefix("usage_"))
    if r.chunk_gaps_us is not None:
        row.update(chunk_gaps_us=" ".join(map(str, r.chunk_gaps_us)))
    return row


def level_rows(data: ExportData) -> list[dict[str, Any]]:
    """Each level summary of run.json flattened, with its verdict figures (queued share, gain...)."""
    rows = []
    for target, verbatim in zip(data.targets, data.verbatim, strict=True):
        verdict_levels = {lv.level: lv for lv in (target.verdict.levels if target.verdict else [])}
        for typed, level in zip(target.levels, _verbatim_levels(verbatim), strict=True):
            row: dict[str, Any] = {"target": target.label, "requests_lost": 0}  # absent from run.json: none
            for key, value in level.items():
                if isinstance(value, dict) and (key.endswith("_ms") or key == "cache_n"):
                    row.update({f"{key}_{k}": v for k, v in value.items()})
                elif key == "metrics":  # registered metrics beyond the built-in ones: <name>_<unit>_<stat>
                    keys = {m.name: m.key for m in metric_defs.all_metrics()}
                    for name, dist in value.items():
                        row.update({f"{keys.get(name, name)}_{k}": v for k, v in dist.items()})
                elif key == "percentiles":  # --percentiles: <key>_<label>
                    row.update({f"{k}_{label}": v for k, at in value.items() for label, v in at.items()})
                elif key == "trimmed":
                    row.update({f"trimmed_{k}": value.get(k) for k in TRIM_FIELDS})
                elif key == "slo":
                    row.update({f"slo_{k}": (value or {}).get(k) for k in SLO_FIELDS})
                elif key == "errors_by_kind":
                    row[key] = ";".join(f"{k}={v}" for k, v in value.items())
                elif key != "server_metrics_delta":
                    row[key] = value
            verdict = verdict_levels.get(typed.level)
            row.update(queued_share=verdict.queued_share if verdict else None,
                       peak_deferred=verdict.peak_deferred if verdict else None,
                       peak_busy_slots=verdict.peak_busy_slots if verdict else None,
                       batching_gain=verdict.batching_gain if verdict else None)
            energy = typed.headline_energy
            row.update({c: getattr(energy, k) for k, c in ENERGY_COLUMNS.items()} if energy is not None else {},
                       environment_changed="; ".join(typed.environment_changed or ()))
            rows.append(row)
    return rows


def _verbatim_levels(target: VerbatimTarget) -> list[dict[str, Any]]:
    """A target's level summaries as run.json holds them (the typed document has the same, in order)."""
    return target.levels or []


def table_rows(data: ExportData) -> list[dict[str, Any]]:
    """A prefill or depth run's rows per target, flattened: a mean ± sd figure becomes KEY_mean,
    KEY_sd and KEY_n columns, the error counts one "kind=n;..." cell."""
    rows = []
    for target, verbatim in zip(data.targets, data.verbatim, strict=True):
        for row in verbatim.section(rows_section(data.doc)).rows or []:
            flat: dict[str, Any] = {"target": target.label}
            for key, value in row.items():
                if isinstance(value, dict) and key != "errors_by_kind":
                    flat.update({f"{key}_{k}": value.get(k) for k in ("mean", "sd", "n")})
                elif key == "errors_by_kind":
                    flat[key] = ";".join(f"{k}={v}" for k, v in (value or {}).items())
                else:
                    flat[key] = value
            rows.append(flat)
    return rows


def turn_rows(data: ExportData) -> list[dict[str, Any]]:
    """A multi-turn run's per-turn figures (analysis/cache.py `conversation_turns`), one row per target
    and turn, the slots as "0;1"; none for another run, or one that kept only some records."""
    cache = data.doc.config.cache_mode if data.doc.config is not None else None
    if cache is None or cache.kind != "multi_turn" or not cache.users or not kept_records(data.doc, data.records):
        return []
    return [{"target": t.label, **asdict(f), "slots": ";".join(map(str, f.slots))}
            for t in data.targets for f in conversation_turns(data.records_of(t.label), cache.users)]


def _turns_csv(data: ExportData) -> ExportFiles:
    rows = turn_rows(data)
    if not rows:
        return []
    out = io.StringIO(newline="")
    writer = csv.DictWriter(out, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    return [("turns.csv", out.getvalue().encode("utf-8"))]


def _router_csv(data: ExportData) -> ExportFiles:
    """A --models run: router.csv, one row per target and model (run.json's `router`, docs/router.md)."""
    from .router import ROW_FIELDS, summary_rows

    rows = [row for t in data.targets if t.router is not None for row in summary_rows(t.label, t.router)]
    if not rows:
        return []
    out = io.StringIO(newline="")
    writer = csv.DictWriter(out, fieldnames=list(ROW_FIELDS))
    writer.writeheader()
    writer.writerows(rows)
    return [("router.csv", out.getvalue().encode("utf-8"))]


class CsvExporter:
    """requests.csv: one row per request, every record field; levels.csv: one row per level."""

    name = "csv"

    def render(self, data: ExportData) -> ExportFiles:
        requests, levels = io.StringIO(newline=""), io.StringIO(newline="")
        writer = csv.DictWriter(requests, fieldnames=with_class_fields(REQUEST_FIELDS, data.doc))
        writer.writeheader()
        if has_classes(data.doc):
            writer.writerows({**request_row(r), "phase": p} for r, p in zip(data.records, request_phases(data),
                                                                             strict=True))
        else:
            writer.writerows(request_row(r) for r in data.records)
        kind = data.doc.kind
        if rows_section(data.doc) is not None:  # a table per target instead of levels
            rows = table_rows(data)
            writer = csv.DictWriter(levels, fieldnames=list(dict.fromkeys(k for row in rows for k in row)))
            writer.writeheader()
            writer.writerows(rows)
            return [("requests.csv", requests.getvalue().encode("utf-8")),
                    (f"{kind}.csv", levels.getvalue().encode("utf-8"))]
        writer = csv.DictWriter(levels, fieldnames=with_class_fields(level_fields(), data.doc) + chosen_fields(data.doc),
                                extrasaction="ignore")
        writer.writeheader()
        writer.writerows(level_rows(data))
        return [("requests.csv", requests.getvalue().encode("utf-8")), ("levels.csv", levels.getvalue().encode("utf-8")),
                *_turns_csv(data), *_router_csv(data)]


class JsonExporter:
    """levels.json: the level summaries of run.json per target, with the verdict."""

    name = "json"

    def render(self, data: ExportData) -> ExportFiles:
        kind, section = data.doc.kind, rows_section(data.doc)
        if section is not None:  # a table per target instead of levels
            table = {"schema": f"loadgen.{kind}", "schema_version": 1, **_verbatim_head(data),
                     "targets": [{**_target_head(t), "n_ctx": raw.section(section).n_ctx,
                                  "rows": raw.section(section).rows or []}
                                 for t, raw in zip(data.targets, data.verbatim, strict=True)]}
            return [(f"{kind}.json", (json.dumps(json_safe(table), indent=2, allow_nan=False) + "\n").encode("utf-8"))]
        doc = {
            "schema": "loadgen.levels",
            "schema_version": 1,
            **_verbatim_head(data),
            "targets": [{**_target_head(t), "levels": _verbatim_levels(raw), "verdict": raw.verdict,
                         **({"router": msgspec.to_builtins(t.router)} if t.router is not None else {})}
                        for t, raw in zip(data.targets, data.verbatim, strict=True)],
            **({"turns": turns} if (turns := turn_rows(data)) else {}),  # a multi-turn run: its per-turn figures
        }
        return [("levels.json", (json.dumps(json_safe(doc), indent=2, allow_nan=False) + "\n").encode("utf-8"))]


def _verbatim_head(data: ExportData) -> dict[str, Any]:
    """The run's kind and completeness as run.json has them (null where a file lacks them, where the
    typed document would say "sweep" and true), and its start."""
    return {"kind": data.run.kind, "complete": data.run.complete, "started_utc": data.doc.started_utc}


def _target_head(target: Target) -> dict[str, Any]:
    return {"label": target.label, "url": target.url, "error": target.error,
            "total_slots": target.server.total_slots if target.server else None}


class JsonlExporter:
    """requests.jsonl: the records as JSON lines, the format a run writes by default."""

    name = "jsonl"

    def render(self, data: ExportData) -> ExportFiles:
        return [("requests.jsonl", encode_lines(msgspec.json.Encoder().encode_lines, data.records))]


class ParquetExporter:
    """requests.parquet: the records as Parquet columns (core/columnar.py; needs pyarrow)."""

    name = "parquet"

    def render(self, data: ExportData) -> ExportFiles:
        out = io.BytesIO()
        columnar.write_records(out, data.records)
        return [(columnar.PARQUET_FILE, out.getvalue())]


EXPORTERS: dict[str, Exporter] = {e.name: e for e in (HgrmExporter(), HlogExporter(), CsvExporter(), JsonExporter(),
                                                       JsonlExporter(), ParquetExporter(), TraceExporter())}
