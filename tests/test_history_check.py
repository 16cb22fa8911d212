"""Which earlier runs the newest is judged against (analysis/history_check.py), on a table of cases
whose expected answers were written down before the code ran; then `loadgen history check` end to
end on simulators: six runs of one identity, and a seventh that is slower, the same, or of another
model."""

from __future__ import annotations

import json
import shutil

import pytest

from loadgen.analysis.history_check import NO_HISTORY, OK, REFUSED, TOO_FEW, RunIdentity, baseline_runs
from servers import SimThread


def run(i, label="a", **fields):
    base = dict(kind="sweep", model="m.gguf", model_size=100, workload_hash="w1", machine_hash="h1")
    return RunIdentity(run_id=i, started_utc=f"2026-12-05T10:{i:02d}:00Z", folder=f"/r/{i}", label=label,
                       **{**base, **fields})


NEWEST = run(9, server_flags="-m m.gguf --parallel 4", model_fingerprint="f1")


@pytest.mark.parametrize("earlier, lookback, expected", [
    # (status, the baseline's run ids newest first, the fields named)
    ([], 10, (NO_HISTORY, (), ())),
    ([run(1, label="b"), run(2, label="b")], 10, (NO_HISTORY, (), ())),  # other targets only
    ([run(1)], 10, (TOO_FEW, (1,), ())),
    ([run(1), run(2), run(3)], 10, (OK, (3, 2, 1), ())),  # flags unknown on the earlier runs
    ([run(1), run(2), run(3)], 2, (OK, (3, 2), ())),  # the lookback keeps the newest
    ([run(1), run(2), NEWEST], 10, (OK, (2, 1), ())),  # the newest is not its own baseline
    ([run(1, model="other.gguf"), run(2, model="other.gguf")], 10, (REFUSED, (), ("model",))),
    ([run(1, model_size=200), run(2, model_size=200, machine_hash="h2")], 10,
     (REFUSED, (), ("model_size", "machine_hash"))),  # named against the most recent earlier run
    # one like-for-like run among others: too few, the others are not counted
    ([run(1), run(2, workload_hash="w2"), run(3, workload_hash="w2")], 10, (TOO_FEW, (1,), ())),
    # a fact unknown on either side is not a change
    ([run(1, model=None), run(2, machine_hash=None)], 10, (OK, (2, 1), ())),
    ([run(1, kind="capacity"), run(2), run(3)], 10, (OK, (3, 2), ())),
    # a grid's cells share the label `server`: a cell of other flags is another question
    ([run(1, server_flags="--parallel 8"), run(2, server_flags="--parallel 8")], 10, (REFUSED, (), ("server_flags",))),
    # a file of the same name and size with other contents (a fine-tune written over the old name)
    ([run(1, model_fingerprint="f2"), run(2, model_fingerprint="f2")], 10, (REFUSED, (), ("model_fingerprint",))),
    # flags unknown (a server loadgen did not start) on the earlier runs: not a change
    ([run(1, server_flags=None), run(2, server_flags=None)], 10, (OK, (2, 1), ())),
])
def test_the_newest_run_is_judged_only_against_runs_of_its_identity(earlier, lookback, expected):
    got = baseline_runs(NEWEST, earlier, lookback)
    assert (got.status, tuple(r.run_id for r in got.runs), got.differs) == expected
    assert (got.reason(NEWEST) == "") == (got.status == OK)


def test_a_refusal_names_the_field_and_both_values():
    got = baseline_runs(NEWEST, [run(1, model="other.gguf")])
    assert "model 'm.gguf' (earlier 'other.gguf')" in got.reason(NEWEST), got.reason(NEWEST)


# Limits wide enough for this shared machine's drift between runs minutes apart (an A/A seventh
# has been 18% slower than six before it), narrow enough that a server three times as slow fails.
LIMITS = ("--metric", "throughput,latency_p50", "--max-throughput-drop", "35%", "--max-latency-rise", "p50:60%")


def _sweep(loadgen, url, out):
    code, _, err = loadgen("sweep", "--url", url, "--concurrency", "2", "--requests", "24", "--warmup", "1",
                           "--n-predict", "16", "--output", out)
    assert code == 0, err


def test_history_check_flags_a_slower_seventh_passes_an_a_a_one_and_refuses_another_model(loadgen, tmp_path,
                                                                                             monkeypatch):
    monkeypatch.setenv("LOADGEN_HISTORY", str(tmp_path / "history.sqlite"))
    with SimThread(slots=2, time_scale=0.2) as fast:
        for i in range(6):
            _sweep(loadgen, fast.url, tmp_path / f"r{i}")
        _sweep(loadgen, fast.url, tmp_path / "same")  # an A/A seventh
        code, out, err = loadgen("history", "check", *LIMITS)
        # never a regression; on a quiet machine it passes (0), on a loaded one the six runs' spread can
        # leave a limit unenforceable, which the gate says (3) rather than guess
        assert code in (0, 3) and "REGRESSION" not in out, out + err
        assert "against 6 earlier run(s)" in err, err
    with SimThread(slots=2, time_scale=0.6) as slow:  # every step three times as long
        _sweep(loadgen, slow.url, tmp_path / "slow")
    code, out, err = loadgen("history", "check", "--lookback", "6", *LIMITS)
    assert code == 1, out + err  # the gate's regression exit
    assert "throughput" in out, out
    # the trend of the target's throughput at c=2 over the runs: eight points, the slow one last, and
    # its change against the one before well below -35%
    code, out, err = loadgen("history", "trend", "--by", "run", "--level", "2")
    assert code == 0, err
    rows = [line for line in out.splitlines() if line.startswith("│ 20")]
    assert len(rows) == 8, out
    assert float(rows[-1].split("│")[-2].strip().rstrip("%")) < -35, rows[-1]
    # a seventh run of another model file: refused before any comparison, naming the field
    doc = json.loads((tmp_path / "slow" / "run.json").read_text())
    shutil.copytree(tmp_path / "r0", tmp_path / "other")
    other = json.loads((tmp_path / "other" / "run.json").read_text())
    other["targets"][0]["server"]["props"]["model_path"] = "/models/another.gguf"
    other["started_utc"] = "2999-01-01T00:00:00Z"  # the newest
    (tmp_path / "other" / "run.json").write_text(json.dumps(other))
    code, out, err = loadgen("history", "import", tmp_path / "other")
    assert code == 0, err
    code, out, err = loadgen("history", "check")
    assert code == 2 and "model" in err and "another.gguf" in err, out + err
    assert doc["kind"] == "sweep"


# history trend, written down first: three runs of build b1 at 100, 110, 90 tok/s, two of b2 at 80 and
# 80, and one of another model (left out): by build, b1 mean 100 sd 10, b2 mean 80 change -20%.
def _row(i, build, value, **fields):
    from loadgen.analysis.history_trend import TrendRow

    return TrendRow(run(i, **fields), build, 2, value)


def test_a_trend_over_builds_keeps_the_newest_runs_identity():
    from loadgen.analysis.history_trend import trend

    rows = [_row(1, "b1", 100.0), _row(2, "b1", 110.0), _row(3, "b1", 90.0), _row(4, "b2", 80.0),
            _row(5, "other", 10.0, model="other.gguf"), _row(6, "b2", 80.0)]
    got = trend(rows, by_build=True)
    assert [(p.name, p.runs, round(p.mean, 6), p.sd and round(p.sd, 6), p.change and round(p.change, 6))
            for p in got.points] == [("b1", 3, 100.0, 10.0, None), ("b2", 2, 80.0, 0.0, -0.2)]
    assert got.left_out == 1
    by_run = trend(rows, by_build=False)
    assert [round(p.change, 6) if p.change is not None else None for p in by_run.points] == [
        None, 0.1, round(90 / 110 - 1, 6), round(80 / 90 - 1, 6), 0.0]
    assert trend([], by_build=True).points == ()


def test_importing_a_run_twice_adds_it_once_and_rate_runs_are_another_identity(tmp_path):
    from loadgen.results.history import identities, import_folder, workload_hash

    run = tmp_path / "r"
    run.mkdir()
    doc = {"kind": "sweep", "started_utc": "2026-12-05T10:00:00Z", "complete": True,
           "config": {"mode": "concurrency", "n_predict": 8},
           "targets": [{"label": "a", "levels": [{"level": 1, "throughput_tok_s": 10.0}]}]}
    (run / "run.json").write_text(json.dumps(doc))
    store = tmp_path / "h.sqlite"
    assert import_folder(store, run) == 1
    assert import_folder(store, run) == 0  # the same run twice would look like two that agree perfectly
    assert len(identities(store)) == 1
    # levels of req/s are not levels of users: an open loop's workload is another identity
    rate = {**doc["config"], "mode": "rate"}
    assert workload_hash(rate) != workload_hash(doc["config"])


def test_history_trend_refuses_a_level_the_newest_run_does_not_have(loadgen, tmp_path, monkeypatch):
    monkeypatch.setenv("LOADGEN_HISTORY", str(tmp_path / "history.sqlite"))
    with SimThread(slots=2, time_scale=0.05) as sim:
        _sweep(loadgen, sim.url, tmp_path / "r0")
    code, out, err = loadgen("history", "trend", "--level", "7")
    assert code == 2 and "no level 7; its levels are 2" in err, out + err
    code, out, err = loadgen("history", "trend", "--level", "2", "--metric", "ttft_ms_p99")
    assert code == 2 and "streamed runs only" in err, out + err


def test_history_trend_draws_its_points_into_a_chart(loadgen, tmp_path):
    from PIL import Image

    from loadgen.results.history import append

    store = tmp_path / "h.sqlite"
    for i, (build, tok_s) in enumerate([("b1", 100.0), ("b1", 104.0), ("b2", 80.0)]):
        append(store, {"kind": "sweep", "started_utc": f"2026-12-05T10:0{i}:00Z", "config": {"n_predict": 8},
                       "targets": [{"label": "a", "server": {"props": {"build_info": build}},
                                    "levels": [{"level": 2, "throughput_tok_s": tok_s}]}]}, f"/r/{i}")
    chart = tmp_path / "trend.png"
    code, out, err = loadgen("history", "trend", "--history", store, "--chart", chart)
    assert code == 0, err
    assert "-21.6%" in out  # b2 against b1's mean of 102
    with Image.open(chart) as img:
        assert img.format == "PNG" and img.size[0] > 300
    code, _, err = loadgen("history", "trend", "--history", store, "--chart", tmp_path / "no" / "such" / "t.png")
    assert code == 2 and "could not write the chart" in err, err
