"""Scenario files through `loadgen run`: shipped files load, bad files exit 2 naming FILE:LINE: key:,
--set overrides the file, and one scenario runs end to end on a simulated llama-server."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from loadgen import cli
from loadgen.cli.run import MODES
from loadgen.cli.scenario import keys_of
from loadgen.results.reader import load_records, load_run_dict
from servers import LOADGEN

SCENARIOS = sorted((Path(__file__).resolve().parent.parent / "scenarios").glob("*.toml"))


def test_the_five_scenarios_ship():
    assert {p.stem for p in SCENARIOS} >= {"moe-vs-dense", "long-prefill", "depth", "soak", "smoke"}


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_every_shipped_scenario_loads_and_says_what_it_measures(loadgen, path):
    code, out, err = loadgen("run", path, "--check")
    assert code == 0, err
    assert "all valid" in out
    header = path.read_text().split("\nmode =")[0]
    assert "What it measures" in header and "What a result means" in header


def test_every_sweep_flag_has_a_key():
    sweep_keys = set(keys_of(cli.cli.get_command(None, "sweep")))
    for flag in ("ports", "url", "label", "concurrency", "rate", "arrival", "burstiness", "max_in_flight",
                 "arrival_seed", "requests", "duration", "warmup", "api", "model", "stream", "api_key", "prompt",
                 "prompt_file", "dataset", "dataset_field", "prompt_tokens", "n_predict", "temperature",
                 "ignore_eos", "seed", "timeout", "wait_ready", "probe_interval", "knee_gain", "knee_latency",
                 "parallel_targets", "output", "force", "histograms"):
        assert flag in sweep_keys
    for mode in MODES:  # every option of every mode is reachable from a file
        command = cli.cli.get_command(None, mode)
        options = [p for p in command.params if p.param_type_name == "option" and p.expose_value]
        assert len(keys_of(command)) == len(options)


BAD = [
    # (file body, line, key, what the message says)
    ('mode = "sweep"\nports = [8080]\nconcurency = [1, 2]\n', 3, "concurency", "unknown key"),
    ('mode = "sweep"\nports = [8080]\nn_predict = "ten"\n', 3, "n_predict", "give a token count"),
    ('mode = "sweep"\nports = [8080]\ntemperature = "hot"\n', 3, "temperature", "expected a number"),
    ('mode = "sweep"\nports = [8080]\nstream = "yes"\n', 3, "stream", "expected true or false"),
    ('mode = "sweep"\nports = [8080]\nprompt = 42\n', 3, "prompt", "expected a string"),
    ('mode = "sweep"\n# no target yet\nports = []\n', 3, "ports", "the list is empty"),
    ('mode = "sweep"\nports = [8080]\n\nconcurrency = [1, 0]\n', 4, "concurrency", "out of range"),
    ('mode = "sweep"\nports = [8080]\nconcurrency = [2, 2]\n', 3, "concurrency", "listed twice"),
    ('mode = "sweep"\nports = [8080]\nconcurrency = "1,x"\n', 3, "concurrency", "not an integer"),
    ('mode = "sweep"\nports = [8080, 70000]\n', 2, "ports", "out of range"),
    ('mode = "sweep"\nports = [8080]\nrate = [1, -2]\n', 3, "rate", "not a positive rate"),
    ('mode = "sweep"\nports = [8080]\nduration = -5\n', 3, "duration", "not a positive duration"),
    ('mode = "soak"\nports = [8080]\nduration = "soon"\n', 3, "duration", "not a duration"),
    ('mode = "soak"\nports = [8080]\nconcurrency = 0\n', 3, "concurrency", "not in the range"),
    ('mode = "depth"\nports = [8080]\ndepths = [0, -1]\n', 3, "depths", "out of range"),
    ('mode = "prefill"\nports = [8080]\nprompt_tokens = []\n', 3, "prompt_tokens", "the list is empty"),
    ('mode = "prefill"\nports = [8080]\nrepeat = 0\n', 3, "repeat", "not in the range"),
    ('mode = "prefill"\nports = [8080]\nconcurrency = [1]\n', 3, "concurrency", "unknown key for mode 'prefill'"),
    ('mode = "bench"\nports = [8080]\n', 1, "mode", "not a mode"),
    ('mode = "sweep"\nports = [8080]\n\n[sweep]\nn_predict = 3\n', 4, "sweep", "tables are not used"),
    ('mode = "sweep"\nports = [8080\n', 2, None, "not valid TOML"),
]


@pytest.mark.parametrize("body,line,key,message", BAD, ids=[f"{b[2]}-{i}" for i, b in enumerate(BAD)])
def test_a_bad_scenario_exits_2_naming_file_line_and_key(loadgen, tmp_path, body, line, key, message):
    path = tmp_path / "bad.toml"
    path.write_text(body)
    code, out, err = loadgen("run", path)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err
    prefix = f"loadgen: error: {path}:{line}: " + (f"{key}: " if key else "")
    assert lines[0].startswith(prefix), lines[0]
    assert message in lines[0]


def test_a_bad_set_value_names_set_and_key(loadgen):
    smoke = next(p for p in SCENARIOS if p.stem == "smoke")
    code, _, err = loadgen("run", smoke, "--set", "concurrency=0", "--check")
    assert code == 2 and err.strip() == ("loadgen: error: --set: concurrency: 0 is out of range "
                                         "(must be between 1 and 4096)")
    code, _, err = loadgen("run", smoke, "--set", "bogus=1", "--check")
    assert code == 2 and "--set: bogus: unknown key for mode 'sweep'" in err


def test_a_check_across_keys_names_the_file(loadgen, tmp_path):
    path = tmp_path / "notarget.toml"
    path.write_text('mode = "sweep"\nn_predict = 8\n')
    code, _, err = loadgen("run", path)
    assert code == 2 and err.strip().endswith(f"{path}: no target: give --ports 8080,8081 or --url http://HOST:PORT")


def test_set_overrides_the_file_and_smoke_runs_on_a_simulator(simulator, tmp_path):
    smoke = next(p for p in SCENARIOS if p.stem == "smoke")
    out = tmp_path / "run"
    proc = subprocess.run([*LOADGEN, "run", str(smoke), "--set", f"url={simulator}", "--set", "concurrency=[1]",
                           "--set", "n_predict=5", "--set", f"output={out}"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = load_run_dict(out)
    assert doc["config"]["n_predict"] == 5 and doc["config"]["prompt_tokens"] == 64  # --set / the file
    assert [t["url"] for t in doc["targets"]] == [simulator]
    assert [lv["concurrency"] for lv in doc["targets"][0]["levels"]] == [1]
    records = load_records(out)
    assert len(records) == 4 and all(r.ok for r in records)
    assert {(r.prompt_n, r.prompt_tokens_target) for r in records} == {(64, 64)}
    assert json.loads((out / "run.json").read_text())["complete"] is True
