"""The workers' histograms as an HdrHistogram interval log: each worker's and their sum, per level.

`RESULTS/histograms/workers.hlog` (a `--workers` run): for every target, level and metric one
interval per worker, tagged `<label>/c<level>/<metric>/worker<k>`, and their sum, tagged as the
`export --format hlog` intervals are (`<label>/c<level>/<metric>`). Any HdrHistogram log reader
can check that the merged histogram is the sum of the workers' (it is: buckets are added).
"""

from __future__ import annotations

import io
from pathlib import Path

from hdrh.histogram import HdrHistogram
from hdrh.log import HistogramLogWriter

from .exporters import hlog_tag, interval_line
from .files import write_files

Merged = dict[tuple[str, int | float], dict[str, tuple[list[HdrHistogram], HdrHistogram]]]


def worker_hlog(merged: Merged) -> bytes:
    with io.StringIO(newline="") as f:
        writer = HistogramLogWriter(f)
        writer.output_log_format_version()
        writer.output_comment("[loadgen --workers: each worker's histograms and their sum, values in µs]")
        writer.output_legend()
        for (label, level), metrics in merged.items():
            for metric, (parts, total) in metrics.items():
                tag = hlog_tag(label, level, metric)
                for k, h in enumerate(parts):
                    f.write(interval_line(f"{tag}/worker{k}", h, 0.0, 0.0))
                f.write(interval_line(tag, total, 0.0, 0.0))
        return f.getvalue().encode("utf-8")


def write_worker_hlog(out_dir: Path, merged: Merged) -> None:
    """RESULTS/histograms/workers.hlog: the workers' histograms and their sum."""
    (out_dir / "histograms").mkdir(exist_ok=True)
    write_files([("workers.hlog", worker_hlog(merged))], out_dir / "histograms")
