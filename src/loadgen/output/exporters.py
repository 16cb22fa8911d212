"""Exporters: a results directory's data rewritten for other tools, one exporter per format.

Every exporter has the same shape (`Exporter.render(data) -> [(file name, bytes)]`) and reads the
same `ExportData` (the run document, the request records, the chosen targets and metrics), so adding
a format is adding one class to `EXPORTERS`. Exporters return bytes and touch no file; `write_files`
(or `export`, both at once) is the one writer. The figures come from `analysis.metrics`.

    hgrm   HdrHistogram percentile distribution text, values in ms: <label>-c<level>-<metric>.hgrm
    hlog   one HdrHistogram interval log per metric, one interval per target and level, tagged
           <label>/c<level>/<metric>, values recorded in µs: <metric>.hlog
    csv    requests.csv (every field of every record) and levels.csv (one row per level summary)
    json   levels.json: every level summary with its target and the saturation verdict
    jsonl, parquet  the records in the other records format (requests.jsonl, requests.parquet)
    trace  the requests as a replayable Mooncake-format trace per target (output/trace_export.py)
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import msgspec
from hdrh.histogram import HdrHistogram
from hdrh.log import HistogramLogWriter

from ..analysis import metrics
from ..core import columnar
from ..core.errors import UserError
from ..core.records import RequestRecord
from ..core.rundoc import is_open_loop
from .files import ExportFiles, write_files
from .trace_export import TraceExporter

US_PER_MS = 1000  # histograms hold µs (metrics.histogram_ms); hgrm and hlog maxima are shown in ms


def _predicted_ms(r: RequestRecord) -> float | None:
    """The server's decode time (first -> last token) of a successful request."""
    return r.predicted_ms if r.ok else None


def _latency_ms(r: RequestRecord) -> float | None:
    return metrics.latency_ms(r) if r.ok else None


def _only_ok(fn: Callable[[RequestRecord], float | None]) -> Callable[[RequestRecord], float | None]:
    return lambda r: fn(r) if r.ok else None


def _itl_ms(r: RequestRecord) -> list[float]:
    return metrics.itl_ms(r) if r.ok else []


# Which per-request figure each --metric name exports; successful requests only, as in run.json.
# Corrected (from the intended send) and uncorrected latency are separate histograms; streaming and
# open-loop metrics are exported only by runs that have them.
METRICS: dict[str, Callable[[RequestRecord], float | None]] = {
    "latency": _latency_ms,
    "latency_uncorrected": _only_ok(metrics.latency_uncorrected_ms),
    "queue_wait": metrics.queue_wait_ms,
    "predicted_ms": _predicted_ms,
    "ttft": _only_ok(metrics.ttft_ms),
    "tpot": _only_ok(metrics.tpot_ms),
    "schedule_lag": metrics.schedule_lag_ms,
}
# Metrics with many values per request.
MULTI_METRICS: dict[str, Callable[[RequestRecord], list[float]]] = {"itl": _itl_ms}
# Metrics that only an open-loop run has: in closed loop the intended send is the actual one, so
# uncorrected latency is latency (an identical file) and there is no schedule to lag behind.
OPEN_LOOP_METRICS = ("latency_uncorrected", "schedule_lag")


class ExportError(UserError):
    """A request the data cannot satisfy (unknown target or metric); the message is for the user."""


@dataclass(frozen=True)
class ExportData:
    """What every exporter reads: one run, narrowed to the chosen targets and metrics."""

    run: dict[str, Any]
    records: list[RequestRecord]
    targets: list[dict[str, Any]]
    metric_names: list[str]

    def records_of(self, label: str, level: int | None = None) -> list[RequestRecord]:
        return [r for r in self.records if r.target == label and (level is None or r.level == level)]


def select(run: dict[str, Any], records: list[RequestRecord], target: str | None = None,
           metric: str | None = None) -> ExportData:
    """Narrow a run to one target and/or one metric; raise ExportError naming what exists."""
    targets = [t for t in run["targets"] if isinstance(t, dict)]
    if target is not None:
        labels = [t.get("label") for t in targets]
        if target not in labels:
            raise ExportError(f"no target {target!r} in this run; it has {', '.join(map(str, labels)) or 'none'}")
        targets = [t for t in targets if t.get("label") == target]
    names = [*METRICS, *MULTI_METRICS]
    if metric is not None and metric not in names:
        raise ExportError(f"unknown metric {metric!r}; choose one of {', '.join(names)}")
    if not is_open_loop(run):
        if metric in OPEN_LOOP_METRICS:
            raise ExportError(f"{metric} is an open-loop metric (sweep --rate); in this closed-loop run "
                              "every request left when it was meant to: export latency")
        names = [m for m in names if m not in OPEN_LOOP_METRICS]
    labels = {t.get("label") for t in targets}
    kept = [r for r in records if r.target in labels]
    if metric is None:  # every metric the run has values for (no TTFT without streaming, ...)
        names = [m for m in names if metric_histogram(kept, m).get_total_count()]
    return ExportData(run=run, records=kept, targets=targets, metric_names=[metric] if metric else names)


def metric_histogram(records: Iterable[RequestRecord], metric: str) -> HdrHistogram:
    """An HdrHistogram (µs) of one metric over the records that have it."""
    if metric in MULTI_METRICS:
        values_of = MULTI_METRICS[metric]
        return metrics.histogram_ms(v for r in records for v in values_of(r))
    value_of = METRICS[metric]
    if metric == "schedule_lag" and not any(r.intended_ns not in (None, r.send_ns) for r in records):
        return metrics.new_histogram()  # closed loop: no schedule, nothing to export
    return metrics.histogram_ms(v for r in records if (v := value_of(r)) is not None)


def file_safe(label: str) -> str:
    """A target label as a file-name part: path separators and odd characters become '_'."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("._") or "target"


def _levels(target: dict[str, Any]) -> list[int]:
    return [lv["level"] for lv in target.get("levels") or []]


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
            label = target["label"]
            for level in _levels(target):
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
    names = [m for m in [*METRICS, *MULTI_METRICS] if is_open_loop(run) or m not in OPEN_LOOP_METRICS]
    files = []
    for label, level, aggregate in levels:
        for metric in names:
            if metric == "schedule_lag" and not aggregate.any_scheduled:
                continue
            histogram = aggregate.histogram(metric)
            if histogram.get_total_count():
                files.append((f"{file_safe(label)}-{level_tag(level)}-{metric}.hgrm", percentile_distribution(histogram)))
    return files


_HGRM_NAME = re.compile(r"^.+-(?:c\d+|r[0-9.e+-]+)-(?:" + "|".join(map(re.escape, [*METRICS, *MULTI_METRICS])) + r")\.hgrm$")


def is_hgrm_name(name: str) -> bool:
    """Whether a file name is one HgrmExporter writes (<label>-c<level>-<metric>.hgrm)."""
    return _HGRM_NAME.match(name) is not None


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
            writer.output_comment(f"[loadgen {data.run.get('kind', 'run')}: {metric}, values in µs, "
                                  f"times in s since the first request; started {data.run.get('started_utc')}]")
            writer.output_legend()
            for target in data.targets:
                for level in _levels(target):
                    records = data.records_of(target["label"], level)
                    histogram = metric_histogram(records, metric)
                    if not histogram.get_total_count():
                        continue
                    start_s = (min(r.send_ns for r in records) - origin_ns) / 1e9
                    end_s = (max(r.complete_ns for r in records) - origin_ns) / 1e9
                    f.write(interval_line(hlog_tag(target["label"], level, metric), histogram, start_s,
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
LEVEL_FIELDS = ["target", "level", "concurrency", "rate", "achieved_rate", "requests_ok", "requests_failed", "requests_cancelled", "errors_by_kind",
                "output_tokens", "wall_s", "throughput_tok_s",
                *(f"latency_ms_{k}" for k in ("count", "mean", "p50", "p90", "p99", "max")),
                *(f"queue_wait_ms_{k}" for k in ("count", "mean", "p50", "p90", "p99", "max")),
                "predicted_ms_mean", "prompt_ms_mean", "decode_tok_s_mean", "stopped_reason",
                "queued_share", "peak_deferred", "peak_busy_slots", "batching_gain",
                *(f"{m}_{k}" for m in ("ttft_ms", "tpot_ms", "itl_ms", "latency_uncorrected_ms", "schedule_lag_ms")
                  for k in ("mean", "p50", "p99")),
                "connections_opened", *(f"connect_ms_{k}" for k in ("mean", "p50", "p99")), "requests_lost"]


def request_row(r: RequestRecord) -> dict[str, Any]:
    """A record as flat CSV cells: `usage` spread over three columns, chunk gaps space-separated."""
    row = r.to_dict()
    usage = row.pop("usage") or {}
    for name in USAGE_FIELDS:
        row[name] = usage.get(name.removeprefix("usage_"))
    if row["chunk_gaps_us"] is not None:
        row["chunk_gaps_us"] = " ".join(map(str, row["chunk_gaps_us"]))
    return row


def level_rows(data: ExportData) -> list[dict[str, Any]]:
    """Each level summary of run.json flattened, with its verdict figures (queued share, gain...)."""
    rows = []
    for target in data.targets:
        verdict_levels = {lv.get("level", lv.get("concurrency")): lv for lv in ((target.get("verdict") or {}).get("levels") or [])}
        for level in target.get("levels") or []:
            row: dict[str, Any] = {"target": target["label"], "requests_lost": 0}  # absent from run.json: none
            for key, value in level.items():
                if isinstance(value, dict) and key.endswith("_ms"):
                    row.update({f"{key}_{k}": v for k, v in value.items()})
                elif key == "errors_by_kind":
                    row[key] = ";".join(f"{k}={v}" for k, v in value.items())
                elif key != "server_metrics_delta":
                    row[key] = value
            verdict = verdict_levels.get(level["level"], {})
            row.update({k: verdict.get(k) for k in ("queued_share", "peak_deferred", "peak_busy_slots",
                                                    "batching_gain")})
            rows.append(row)
    return rows


class CsvExporter:
    """requests.csv: one row per request, every record field; levels.csv: one row per level."""

    name = "csv"

    def render(self, data: ExportData) -> ExportFiles:
        requests, levels = io.StringIO(newline=""), io.StringIO(newline="")
        writer = csv.DictWriter(requests, fieldnames=REQUEST_FIELDS)
        writer.writeheader()
        writer.writerows(request_row(r) for r in data.records)
        writer = csv.DictWriter(levels, fieldnames=LEVEL_FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(level_rows(data))
        return [("requests.csv", requests.getvalue().encode("utf-8")), ("levels.csv", levels.getvalue().encode("utf-8"))]


class JsonExporter:
    """levels.json: the level summaries of run.json per target, with the verdict."""

    name = "json"

    def render(self, data: ExportData) -> ExportFiles:
        doc = {
            "schema": "loadgen.levels",
            "schema_version": 1,
            "kind": data.run.get("kind"),
            "complete": data.run.get("complete"),
            "started_utc": data.run.get("started_utc"),
            "targets": [{"label": t["label"], "url": t.get("url"), "error": t.get("error"),
                         "total_slots": (t.get("server") or {}).get("total_slots"),
                         "levels": t.get("levels") or [], "verdict": t.get("verdict")} for t in data.targets],
        }
        return [("levels.json", (json.dumps(doc, indent=2, allow_nan=False) + "\n").encode("utf-8"))]


class JsonlExporter:
    """requests.jsonl: the records as JSON lines, the format a run writes by default."""

    name = "jsonl"

    def render(self, data: ExportData) -> ExportFiles:
        return [("requests.jsonl", msgspec.json.Encoder().encode_lines(data.records))]


class ParquetExporter:
    """requests.parquet: the records as Parquet columns (core/columnar.py; needs pyarrow)."""

    name = "parquet"

    def render(self, data: ExportData) -> ExportFiles:
        out = io.BytesIO()
        columnar.write_records(out, data.records)
        return [(columnar.PARQUET_FILE, out.getvalue())]


EXPORTERS: dict[str, Exporter] = {e.name: e for e in (HgrmExporter(), HlogExporter(), CsvExporter(), JsonExporter(),
                                                       JsonlExporter(), ParquetExporter(), TraceExporter())}
