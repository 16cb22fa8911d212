"""`--ray`: the workers as Ray async actors on a local Ray cluster started for the run, checked against
a `--workers 2` run of the same sweep; no Ray process it started is left; without Ray, one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from servers import SimProcess, start_llama_server, sweep

try:
    import ray  # noqa: F401
    HAVE_RAY = True
except ImportError:
    HAVE_RAY = False

needs_ray = pytest.mark.skipif(not HAVE_RAY and os.environ.get("CI") != "true",
                               reason="Ray is not installed: pip install 'loadgen[ray]'")
RAY_PROCESSES = ("raylet", "gcs_server", "ray::", "ray/dashboard", "ray/_private", "plasma_store")


def _ray_pids() -> set[int]:
    pids = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if any(name in cmd for name in RAY_PROCESSES):
                pids.add(int(proc.name))
    return pids


def _levels(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / "run.json").read_text())["targets"][0]["levels"]


def _seqs(run_dir: Path) -> list[tuple]:
    return sorted((r["level"], r["seq"], r["error_kind"]) for r in map(json.loads, (run_dir / "requests.jsonl").open()))


def _ray_against_workers(url: str, out: Path, *args: str) -> None:
    before = _ray_pids()
    common = ["--url", url, "--concurrency", "1,3", "--requests", "9", *args]
    ray_run = sweep(*common, "--workers", "2", "--ray", "--output", str(out / "ray"))
    assert ray_run.returncode == 0, ray_run.stderr
    procs = sweep(*common, "--workers", "2", "--output", str(out / "procs"))
    assert procs.returncode == 0, procs.stderr
    for a, b in zip(_levels(out / "ray"), _levels(out / "procs")):
        assert (a["level"], a["requests_ok"], a["requests_failed"], a["output_tokens"]) == \
            (b["level"], b["requests_ok"], b["requests_failed"], b["output_tokens"])
        assert [w["concurrency"] for w in a["workers"]] == [w["concurrency"] for w in b["workers"]]
        assert all(w["host"] for w in a["workers"])
        # Latencies are not compared by value (no timed asserts here): both runs have them all.
        assert a["latency_ms"]["count"] == b["latency_ms"]["count"] == 9
    assert _seqs(out / "ray") == _seqs(out / "procs")
    assert json.loads((out / "ray" / "run.json").read_text())["config"]["ray"] == "local"
    deadline = time.monotonic() + 60
    while _ray_pids() - before:  # the local cluster it started goes with it
        assert time.monotonic() < deadline, f"Ray processes left: {sorted(_ray_pids() - before)}"
        time.sleep(0.1)


@needs_ray
def test_a_two_actor_sweep_on_a_local_ray_cluster_matches_two_worker_processes(tmp_path) -> None:
    with SimProcess("--profile", "smoke", "--slots", "4", "--time-scale", "0.05") as sim:
        _ray_against_workers(sim.url, tmp_path, "--n-predict", "8")


@needs_ray
@pytest.mark.real
def test_a_two_actor_sweep_against_the_real_server_matches_two_worker_processes(tmp_path) -> None:
    server = start_llama_server("ray-real", 4, tmp_path)
    try:
        _ray_against_workers(server.url, tmp_path, "--n-predict", "8")
    finally:
        server.stop()


def test_without_ray_the_flag_says_how_to_install_it(tmp_path) -> None:
    code = "import sys; sys.modules['ray'] = None; from loadgen.cli import main; main()"
    done = subprocess.run([sys.executable, "-c", code, "sweep", "--url", "http://127.0.0.1:9", "--ray",
                           "--output", str(tmp_path / "r")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith("--ray needs Ray, which is not installed: "
                                                         "pip install 'loadgen[ray]'")
    assert not (tmp_path / "r").exists()
