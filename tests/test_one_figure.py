"""One number per figure: every output shows a level's p50 and queue wait as run.json holds them."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from loadgen.analysis.aggregate import summarize_level
from loadgen.core.records import LevelRun, RequestRecord
from loadgen.output.html import TABLE_COLUMNS, level_row
from loadgen.output.layout import filled_rows, text_of
from loadgen.output.progress import ProgressObserver
from loadgen.output.report_model import RunSource, build_series
from loadgen.output.tables import queue_table
from loadgen.results.reader import load_run

MS = 1_000_000
DATA = Path(__file__).parent / "data"


def rec(seq: int, latency_ms: float) -> RequestRecord:
    return RequestRecord(target="t", level=2, worker=seq % 2, seq=seq, salt=f"s{seq}", send_ns=0,
                         complete_ns=int(latency_ms * MS), status=200, prompt_ms=10.0, predicted_ms=90.0,
                         predicted_n=16, predicted_per_second=170.0)


def test_progress_line_p50_is_run_json_p50():
    # Two requests: statistics.median says 600 ms (the midpoint); run.json's HdrHistogram p50 is the
    # value of rank round(0.5 * 2) = 1, i.e. 587 ms. The progress line must say the latter.
    level = LevelRun(target="t", concurrency=2, records=[rec(0, 587.0), rec(1, 613.0)], finished=True)
    summary = summarize_level(2, level.records)
    out = io.StringIO()
    observer = ProgressObserver(Console(file=out, width=200))
    observer.level_done(None, None, level)
    assert f"latency p50 {summary.latency_ms.p50:,.0f} ms" in out.getvalue()
    assert "latency p50 600 ms" not in out.getvalue()


def _cells(grid) -> list[list[str]]:
    return [[text_of(c) for c in row] for row in filled_rows(grid)]  # a target's label on every row


@pytest.mark.parametrize("run", ["sweep-smollm2", "sweep-sim-v2"])
def test_queue_wait_p99_is_one_figure_in_terminal_and_reports(run):
    doc = load_run(DATA / run)
    table = queue_table(doc)
    headers = [c.title for c in table.columns]
    p99_column = headers.index("p99")
    rows = _cells(table)
    series = build_series([RunSource(run, doc, [], [])])
    report_p99 = TABLE_COLUMNS.index("queue wait p99")
    checked = 0
    for s in series:
        for level in s.levels:
            expected = level.queue_wait_ms.p99
            row = next(r for r in rows if r[1] == f"{level.level:g}" and r[0] == s.label)
            assert row[p99_column] == f"{expected:,.0f}"  # the terminal
            assert level_row(s, level)[report_p99] == f"{expected:,.1f}"  # HTML and Markdown
            checked += 1
    assert checked
    # the golden run had a c=1 overhead, so the corrected figure would differ from the level's
    differs = [lv for t in doc.targets for lv, v in zip(t.levels, t.verdict.levels)
               if round(lv.queue_wait_ms.p99) != round(v.queue_wait_ms.p99)]
    assert differs or run != "sweep-smollm2"
