"""`loadgen tune`: the finalists picked from a screen (analysis/tune_plan.py) on a table written down
before the code ran; then a search over a stand-in server whose best cell is known."""

from __future__ import annotations

import pytest

from loadgen.analysis.tune_plan import Screened, pick_finalists, seconds_between


def s(cell, low, reason=None):
    return Screened(cell, cell, low, reason)


@pytest.mark.parametrize("screened, k, finalists, dropped", [
    ([s("a", 1), s("b", 2), s("c", 4)], 2, ("c", "b"), {"a": "screened at 1, below the finalists' 2"}),
    ([s("a", 2), s("b", 2), s("c", 4)], 2, ("c", "a", "b"), {}),  # a tie at the cut is kept
    ([s("a", 3), s("b", None, "failed: exited with code 1"), s("c", None, "infeasible: needs 9 MiB")], 2,
     ("a",), {"b": "failed: exited with code 1", "c": "infeasible: needs 9 MiB"}),
    ([s("a", None, "failed")], 2, (), {"a": "failed"}),
    ([s("a", 0), s("b", 0)], 1, ("a", "b"), {}),  # nothing passed anywhere: all race (a tie)
    ([s("a", 5), s("b", 4), s("c", 3)], 5, ("a", "b", "c"), {}),  # fewer cells than k
])
def test_the_best_screened_cells_race_and_ties_at_the_cut_are_kept(screened, k, finalists, dropped):
    got = pick_finalists(screened, k)
    assert (got.finalists, got.dropped) == (finalists, dropped)


def test_a_servers_lifetime_is_read_from_its_runs_times():
    assert seconds_between("2026-12-05T10:00:00+00:00", "2026-12-05T10:01:30.5+00:00") == 90.5
    assert seconds_between(None, "2026-12-05T10:00:00+00:00") == 0.0


def test_tune_screens_every_cell_and_names_the_best_the_full_search_finds(tmp_path):
    """Written down first: on the stand-in server a cell with N slots serves exactly N users within
    ttft<=150ms (tests/test_grid_capacity_cli.py), and `-fa bogus` is refused at boot. Over
    parallel=1,2,4 x fa=on,bogus: the three bogus cells fail with their reason, parallel=1 is dropped
    by the screen; parallel=2 (2 pass, 4 fail: at most 3) is below parallel=4's 4 beyond the 10% noise, so
    only parallel=4 (fa on) has its full search, from --start 4, and wins."""
    import json

    from loadgen.core.processes import pid_alive
    from servers import CAPACITY_SIM, GRID_SERVER, LOADGEN, grid_pids

    profile = tmp_path / "capsim.toml"
    profile.write_text(CAPACITY_SIM)
    out = tmp_path / "tune"
    import subprocess

    proc = subprocess.run([*LOADGEN, "tune", "--server", f"{GRID_SERVER} --parallel {{parallel}} -fa {{fa}} --profile "
                           f"{profile} --time-scale 1", "--param", "parallel=1,2,4", "--param", "fa=on,bogus",
                           "--screen-budget", "40", "--finalists", "2", "--final-repeat", "2",
                           "--stream", "--slo", "ttft=150ms", "--n-predict", "16", "--warmup", "1",
                           "--max-concurrency", "4", "--output", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "tune.json").read_text())
    status = {c["name"]: c["status"] for c in doc["cells"]}
    assert status == {"parallel=1 fa=on": "dropped", "parallel=1 fa=bogus": "failed",
                      "parallel=2 fa=on": "dropped", "parallel=2 fa=bogus": "failed",
                      "parallel=4 fa=on": "winner", "parallel=4 fa=bogus": "failed"}, status
    assert doc["winner"]["params"] == {"parallel": "4", "fa": "on"}
    assert "--port" not in doc["winner"]["argv"] and "-lv" not in doc["winner"]["argv"]  # the template's command, to copy
    assert doc["winner"]["argv"][doc["winner"]["argv"].index("--parallel") + 1] == "4"
    dropped = next(c for c in doc["cells"] if c["name"] == "parallel=1 fa=on")
    assert dropped["reason"] == "screened at 1, below the finalists' 2", dropped
    second = next(c for c in doc["cells"] if c["name"] == "parallel=2 fa=on")
    assert second["reason"] == "screened at 3 at most, below the leader's 4 beyond the 10% noise: not searched again"
    assert doc["tie"] is False and "the runner-up, parallel=2 fa=on" in doc["sentence"], doc["sentence"]
    final = json.loads((out / "final" / "grid.json").read_text())
    assert [c["measure_args"] for c in final["cells"]] == [["--start", "4"]]  # from the screen's answer
    assert final["repeat"] == 1  # a lone finalist: one full search
    assert doc["server_seconds"] > 0 and doc["full_grid_estimate_s"] > 0
    assert "winner's command line:" in proc.stdout
    for stage in ("screen", "final"):
        assert not any(pid_alive(p) for p in grid_pids(out / stage))  # no server outlives the search
    # --resume of a finished search runs nothing again: the same answer, the same server time
    again = subprocess.run([*LOADGEN, "tune", "--resume", str(out)], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    redo = json.loads((out / "tune.json").read_text())
    assert (redo["winner"], redo["server_seconds"]) == (doc["winner"], doc["server_seconds"])
    refused = subprocess.run([*LOADGEN, "tune", "--resume", str(out), "--param", "parallel=8"], capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode == 2 and "--resume continues a search as it was given" in refused.stderr


def test_a_tune_where_no_cell_could_run_fails_and_a_used_folder_needs_force(tmp_path):
    import subprocess

    from servers import LOADGEN

    out = tmp_path / "t"
    args = [*LOADGEN, "tune", "--server", f"{tmp_path}/no-such-server --port {{port}} --slots {{s}}", "--param", "s=1,2",
            "--slo", "e2e=1s", "--output", str(out)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "no cell could be measured" in proc.stderr, proc.stderr
    again = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "already holds a tune" in again.stderr, again.stderr
    forced = subprocess.run([*args, "--force"], capture_output=True, text=True, timeout=120)
    assert forced.returncode == 1, forced.stderr  # run again from scratch: the same cells fail again


@pytest.mark.parametrize("args, message", [
    (("--repeat", "3"), "--repeat: tune sets it per stage"),
    (("--budget", "soon"), "is not a duration"),
])
def test_capacity_options_tune_sets_itself_are_refused(loadgen, tmp_path, args, message):
    code, _, err = loadgen("tune", "--server", "x --p {a}", "--param", "a=1,2", "--slo", "e2e=1s", *args,
                           "--output", tmp_path / "t")
    assert code == 2 and message in err, err
    assert not (tmp_path / "t").exists()


def test_a_budget_stops_the_search_and_says_what_it_left_out(tmp_path):
    """Written down first: with --budget 1s the first screen run starts (nothing is known of a run's cost
    yet) and takes more than a second of server time, so the other three cells are never screened and the
    lone finalist's one final run never starts; tune.json and the output say so."""
    import json
    import subprocess

    from loadgen.core.processes import pid_alive
    from servers import CAPACITY_SIM, GRID_SERVER, LOADGEN, grid_pids

    profile = tmp_path / "capsim.toml"
    profile.write_text(CAPACITY_SIM)
    out = tmp_path / "tune"
    proc = subprocess.run([*LOADGEN, "tune", "--server", f"{GRID_SERVER} --parallel {{parallel}} --profile {profile} "
                           "--time-scale 1", "--param", "parallel=1,2,3,4", "--screen-budget", "16", "--budget", "1s",
                           "--stream", "--slo", "ttft=150ms", "--n-predict", "16", "--warmup", "1",
                           "--max-concurrency", "4", "--output", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "tune.json").read_text())
    status = [c["status"] for c in doc["cells"]]
    assert status == ["finalist", "untried", "untried", "untried"], status
    assert doc["cells"][1]["reason"] == "not screened: the --budget of 1 s was spent"
    assert doc["budget_s"] == 1 and doc["cut"] == "3 cell(s) not screened, 1 final run(s) not run", doc["cut"]
    assert doc["winner"] is None
    assert "cut by the --budget of 1 s" in proc.stdout and "--budget of 1 s is spent" in proc.stderr
    assert not any(pid_alive(p) for stage in ("screen", "final") if (out / stage).is_dir() for p in grid_pids(out / stage))


def c(cell, low, censored=False):
    return Screened(cell, cell, low, None, censored)


@pytest.mark.parametrize("screened, k, advance", [
    ([c("a", 1), c("b", 2), c("c", 4)], 2, ()),  # two race: decided
    ([c("a", 4, True), c("b", 4, True), c("c", 4, True), c("d", 1)], 2, ("a", "b", "c")),  # a budget-made tie
    ([c("a", 4), c("b", 4), c("c", 4)], 2, ()),  # a real tie: the final races it
    ([c("a", 6), c("b", 4, True), c("c", 4)], 2, ("a", "b", "c")),  # the cut's tie is censored on one side
    ([c("a", 6, True), c("b", 4), c("c", 4)], 2, ()),  # a censored leader is a finalist anyway; the cut's tie is real
    ([c("a", None), c("b", 3, True)], 1, ()),  # one answer: decided
    # a censored cell below the cut may reach past it (a search that started at a higher bar runs out of
    # budget sooner): screened again with the finalists, never dropped by a budget
    ([c("a", 6), c("b", 6), c("c", 5, True)], 2, ("a", "b", "c")),
    ([c("a", 6, True), c("b", 6, True), c("c", 5, True), c("d", 2)], 2, ("a", "b", "c")),
    ([c("a", 6), c("b", 4, True)], 1, ("a", "b")),
    ([c("a", 6), c("b", 4)], 1, ()),  # b's search ended below the cut on its own: decided
])
def test_a_tie_the_budget_made_is_screened_again(screened, k, advance):
    from loadgen.analysis.tune_plan import next_round

    assert next_round(screened, k) == advance


def test_a_scenario_file_runs_tune_with_its_capacity_keys_checked(loadgen, tmp_path):
    scenario = tmp_path / "tune.toml"
    scenario.write_text('mode = "tune"\nserver = "llama-server -m m.gguf --parallel {parallel}"\n'
                        'param = ["parallel=1,2,4"]\nfinal_repeat = 2\nslo = "ttft=1s"\nstream = true\nn_predict = 32\n')
    code, _, err = loadgen("run", scenario, "--check")
    assert code == 0 and "mode tune" in err + _, err
    scenario.write_text(scenario.read_text().replace("stream = true\n", ""))  # capacity's own rule, across keys
    code, _, err = loadgen("run", scenario, "--check")
    assert code == 2 and "add --stream" in err, err
    scenario.write_text(scenario.read_text().replace("n_predict", "n_predic"))
    code, _, err = loadgen("run", scenario, "--check")
    assert code == 2 and "n_predic: unknown key for mode 'tune'" in err and "did you mean 'n_predict'" in err, err
