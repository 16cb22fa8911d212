"""`loadgen export` on a committed real sweep (tests/data/sweep-smollm2: 1 target, c=1,2, 6 requests each)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from hdrh.log import HistogramLogReader

from loadgen.analysis import metrics
from loadgen.cli.report import export_command
from loadgen.results.reader import load_records, load_run_dict

FIXTURE = Path(__file__).parent / "data" / "sweep-smollm2"


def export(*args: str):
    return CliRunner().invoke(export_command, [*args], catch_exceptions=False)


@pytest.fixture(scope="module")
def run():
    return load_run_dict(FIXTURE)


def run_levels(run):
    return [(t["label"], lv) for t in run["targets"] for lv in t["levels"]]


def test_hlog_round_trip_matches_run_json(tmp_path, run):
    result = export(str(FIXTURE), "--format", "hlog", "--metric", "latency", "--output", str(tmp_path))
    assert result.exit_code == 0, result.output
    reader = HistogramLogReader(str(tmp_path / "latency.hlog"), metrics.new_histogram())
    intervals = {}
    while (h := reader.get_next_interval_histogram()) is not None:
        intervals[h.get_tag()] = h
    reader.close()
    expected = run_levels(run)
    assert set(intervals) == {f"{label}/c{lv['concurrency']}/latency" for label, lv in expected}
    for label, lv in expected:
        h = intervals[f"{label}/c{lv['concurrency']}/latency"]
        assert h.get_total_count() == lv["latency_ms"]["count"]
        assert h.get_value_at_percentile(50) / 1000 == lv["latency_ms"]["p50"]
        assert h.get_value_at_percentile(99) / 1000 == lv["latency_ms"]["p99"]
        assert h.get_max_value() / 1000 == lv["latency_ms"]["max"]

    # Intervals merge: adding every level's interval gives the histogram of all requests.
    merged = metrics.new_histogram()
    reader = HistogramLogReader(str(tmp_path / "latency.hlog"), merged)
    while reader.add_next_interval_histogram() is not None:
        pass
    reader.close()
    all_ok = [metrics.latency_ms(r) for r in load_records(FIXTURE) if r.ok]
    assert merged.get_total_count() == len(all_ok)
    assert merged.get_value_at_percentile(50) == metrics.histogram_ms(all_ok).get_value_at_percentile(50)


def read_hgrm(path: Path) -> list[tuple[float, float, int]]:
    """(value ms, percentile 0..1, total count) per row of an .hgrm file."""
    rows = []
    for line in path.read_text().splitlines():
        fields = line.split()
        if not fields or line.startswith("#") or fields[0] == "Value":
            continue
        rows.append((float(fields[0]), float(fields[1]), int(fields[2])))
    return rows


def value_at(rows, percentile: float) -> float:
    """HdrHistogram's value at a percentile, read off the file's cumulative counts.

    (hdrhistogram 0.10's percentile ticks do not land on 50% or 99%, so the row to read is the
    first whose TotalCount reaches the count HdrHistogram uses for that percentile.)
    """
    total = rows[-1][2]
    count = max(1, int(percentile / 100 * total + 0.5))
    return next(value for value, _, total_count in rows if total_count >= count)


def test_hgrm_rows_match_run_json(tmp_path, run):
    result = export(str(FIXTURE), "--format", "hgrm", "--output", str(tmp_path))
    assert result.exit_code == 0, result.output
    for label, lv in run_levels(run):
        for metric in ("latency", "queue_wait", "predicted_ms"):
            assert (tmp_path / f"{label}-c{lv['concurrency']}-{metric}.hgrm").is_file()
        path = tmp_path / f"{label}-c{lv['concurrency']}-latency.hgrm"
        rows = read_hgrm(path)
        assert rows[-1][1] == 1.0 and rows[-1][2] == lv["latency_ms"]["count"]
        assert value_at(rows, 50) == lv["latency_ms"]["p50"]
        assert value_at(rows, 99) == lv["latency_ms"]["p99"]
        assert rows[-1][0] == lv["latency_ms"]["max"]
        footer = path.read_text()
        assert f"Max     = {lv['latency_ms']['max']:12.3f}" in footer
        stddev_ms = float(footer.split("StdDeviation   =")[1].split("]")[0])
        assert stddev_ms < lv["latency_ms"]["max"]  # in ms, like the values


def test_csv_one_row_per_request_and_per_level(tmp_path, run):
    result = export(str(FIXTURE), "--format", "csv", "--output", str(tmp_path))
    assert result.exit_code == 0, result.output
    records = load_records(FIXTURE)
    with (tmp_path / "requests.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(records)
    expected = set(records[0].to_dict()) - {"usage"} | {"usage_prompt_tokens", "usage_completion_tokens",
                                                        "usage_total_tokens"}
    assert set(rows[0]) == expected
    assert [int(r["send_ns"]) for r in rows] == [r.send_ns for r in records]
    with (tmp_path / "levels.csv").open(newline="") as f:
        levels = list(csv.DictReader(f))
    assert [(r["target"], int(r["concurrency"])) for r in levels] == \
        [(label, lv["concurrency"]) for label, lv in run_levels(run)]
    assert [float(r["latency_ms_p99"]) for r in levels] == [lv["latency_ms"]["p99"] for _, lv in run_levels(run)]


def test_json_level_summaries(tmp_path, run):
    result = export(str(FIXTURE), "--format", "json", "--output", str(tmp_path))
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "levels.json").read_text())
    assert doc["schema"] == "loadgen.levels"
    assert [t["levels"] for t in doc["targets"]] == [t["levels"] for t in run["targets"]]


def test_default_out_is_the_results_dir(tmp_path):
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(FIXTURE, copy)
    result = export(str(copy), "--format", "json")
    assert result.exit_code == 0, result.output
    assert (copy / "levels.json").is_file()


@pytest.mark.parametrize("args, message", [
    (["/nonexistent/run", "--format", "csv"], "no such directory"),
    ([str(FIXTURE), "--format", "hgrm", "--target", "nope"], "no target 'nope'"),
    ([str(FIXTURE), "--format", "hgrm", "--metric", "e2e"], "unknown metric 'e2e'"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, args, message):
    result = CliRunner().invoke(export_command, [*args, "--output", str(tmp_path)])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


def test_not_a_results_dir_exits_2(tmp_path):
    result = CliRunner().invoke(export_command, [str(tmp_path), "--format", "csv"])
    assert result.exit_code == 2
    assert len(result.output.strip().splitlines()) == 1 and "run.json" in result.output


def test_hlog_interval_max_keeps_microseconds(tmp_path, run):
    # Interval_Max is the histogram's max / maxValueUnitRatio as a real number (the Java and .NET
    # writers print it with 3 decimals); hdrh's writer floor-divided it to whole ms.
    result = export(str(FIXTURE), "--format", "hlog", "--metric", "latency", "--output", str(tmp_path))
    assert result.exit_code == 0, result.output
    lines = [line for line in (tmp_path / "latency.hlog").read_text().splitlines() if line.startswith("Tag=")]
    maxima = {line.split(",")[0].removeprefix("Tag="): float(line.split(",")[3]) for line in lines}
    expected = {f"{label}/c{lv['concurrency']}/latency": lv["latency_ms"]["max"] for label, lv in run_levels(run)}
    assert maxima == {tag: round(v, 3) for tag, v in expected.items()}
    assert any(v != int(v) for v in maxima.values())  # the golden's maxima are not whole ms


def test_closed_loop_has_no_uncorrected_latency_or_schedule_lag_to_export(tmp_path, run):
    result = export(str(FIXTURE), "--format", "hgrm", "--output", str(tmp_path))
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in tmp_path.iterdir())
    assert any(n.endswith("-latency.hgrm") for n in names)
    assert not any("latency_uncorrected" in n or "schedule_lag" in n for n in names), names
    result = CliRunner().invoke(export_command, [str(FIXTURE), "--format", "hgrm", "--metric", "latency_uncorrected",
                                                 "--output", str(tmp_path / "u")])
    assert result.exit_code == 2 and "open-loop metric" in result.output


def test_force_replaces_the_previous_runs_histograms_and_keeps_other_files(loadgen, tmp_path):
    from servers import SimThread

    out = tmp_path / "run"
    with SimThread(slots=2) as sim:
        base = ["sweep", "--url", sim.url, "--label", "sim", "--requests", "2", "--n-predict", "4", "--warmup", "0",
                "--output", out]
        code, _, err = loadgen(*base, "--concurrency", "1,2")
        assert code == 0, err
        first = sorted(p.name for p in (out / "histograms").iterdir())
        assert "sim-c2-latency.hgrm" in first
        assert not any("latency_uncorrected" in n for n in first), first  # closed loop: it would equal latency
        (out / "histograms" / "notes.txt").write_text("mine")
        (out / "histograms" / "mine.hgrm").write_text("mine")
        code, _, err = loadgen(*base, "--concurrency", "1", "--force")
        assert code == 0, err
    names = sorted(p.name for p in (out / "histograms").iterdir())
    assert not any("-c2-" in n for n in names), names  # the earlier run's level is gone
    assert "sim-c1-latency.hgrm" in names and {"notes.txt", "mine.hgrm"} <= set(names)


def test_export_help_names_every_exported_metric_from_their_definitions():
    from loadgen.analysis import metric_defs
    result = CliRunner().invoke(export_command, ["--help"], terminal_width=400)
    names = [m.name for m in metric_defs.all_metrics() if m.export]
    assert {"ttfa", "ttft_queue", "latency", "itl"} <= set(names)
    text = " ".join(result.output.split())
    assert "hgrm/hlog only: " + ", ".join(names[:-1]) + " or " + names[-1] in text, text


def test_no_ttfa_histogram_without_a_request_that_reasoned(loadgen, tmp_path):
    import msgspec

    from loadgen.output.exporters import metric_histogram
    from servers import SimThread

    out = tmp_path / "run"
    with SimThread(slots=2) as sim:  # a model that does not think: its TTFA would be its TTFT
        code, _, err = loadgen("sweep", "--url", sim.url, "--label", "sim", "--requests", "2", "--n-predict", "4",
                               "--warmup", "0", "--concurrency", "1", "--stream", "--histograms", "--output", out)
    assert code == 0, err
    code, _, err = loadgen("export", out, "--format", "hgrm", "--output", tmp_path / "hgrm")
    assert code == 0, err
    for folder in (out / "histograms", tmp_path / "hgrm"):
        names = sorted(p.name for p in folder.iterdir())
        assert "sim-c1-ttft.hgrm" in names and "sim-c1-ttft_queue.hgrm" in names, names
        assert not any(n.endswith("-ttfa.hgrm") for n in names), names
    records = load_records(out)
    assert metric_histogram(records, "ttfa").get_total_count() == 0
    reasoned = [msgspec.structs.replace(r, reasoning_tokens=0) for r in records]  # the server said how many
    assert metric_histogram(reasoned, "ttfa").get_total_count() == metric_histogram(records, "ttft").get_total_count()
