"""`loadgen capacity` against a real 1-slot llama-server of the test bed: the answer equals the
highest passing level of an exhaustive sweep of the same server, workload and SLO, with fewer
requests. The workload is a user's (streamed, prompt and answer lengths drawn per request: the
sweep's options, issue 47), the same seed in both.

The target is a queue wait (latency − prompt_ms − predicted_ms) of half the server's own decode
time at c=1 (this machine's speed varies with its load, so no fixed figure would do): with one
slot, a request at c=1 waits for nothing (a few ms of HTTP), and at c=2 each waits for the other's
whole answer, so the answer is 1 (a cliff) however fast or busy the machine is, within a factor 2."""

from __future__ import annotations

import json
import subprocess

import pytest

from servers import LOADGEN, start_llama_server

pytestmark = [pytest.mark.real, pytest.mark.timeout(900)]

COMMON = ("--n-predict", "48", "--warmup", "1")
WORKLOAD = ("--stream", "--prompt-tokens", "uniform:80:160", "--n-predict", "normal:40,6", "--workload-seed", "7",
            "--warmup", "1")


def loadgen(*args) -> subprocess.CompletedProcess:
    return subprocess.run([*LOADGEN, *map(str, args)], capture_output=True, text=True, timeout=800)


def test_capacity_on_the_test_bed_equals_the_exhaustive_sweep(tmp_path):
    server = start_llama_server("smollm2-1slot", 1, tmp_path)
    try:
        calib = loadgen("sweep", "--url", server.url, *COMMON, "--concurrency", "1", "--output", tmp_path / "c1")
        assert calib.returncode == 0, calib.stderr
        c1 = json.loads((tmp_path / "c1" / "run.json").read_text())["targets"][0]["levels"][0]
        slo = ("--slo", f"queue={c1['predicted_ms_mean'] / 2:.0f}ms")
        cap = loadgen("capacity", "--url", server.url, *COMMON, *slo, "--max-concurrency", "4", "--format", "json",
                      "--output", tmp_path / "cap")
        assert cap.returncode == 0, cap.stderr
        result = json.loads(cap.stdout)["capacity"]
        top = 2 * max(result["feasible_max"] or 1, 1)
        sweep = loadgen("sweep", "--url", server.url, *COMMON, *slo, "--concurrency",
                        ",".join(map(str, range(1, top + 1))), "--output", tmp_path / "all")
        assert sweep.returncode == 0, sweep.stderr
    finally:
        server.stop()
    swept = json.loads((tmp_path / "all" / "run.json").read_text())["targets"][0]["levels"]
    passing = [lv["level"] for lv in swept if lv["slo"]["passed"]]
    print(slo, result["verdict"], [(lv["level"], lv["slo"]["attainment"]) for lv in swept])
    assert result["feasible_max"] == 1 and max(passing, default=None) == 1, (result["verdict"], passing)
    assert result["binding"] == "queue" and "its slot is full" in result["verdict"], result["verdict"]
    # an answer of 1 probes c=1 and c=2, the exhaustive ladder itself: no fewer requests, never more
    assert result["requests"] <= sum(lv["requests_ok"] + lv["requests_failed"] for lv in swept)


def test_capacity_of_a_drawn_streamed_workload_within_ttft_equals_the_exhaustive_sweep(tmp_path):
    # The TTFT target: c=1's worst TTFT (its prefill) and half its mean decode. At c=2 on one slot a
    # request's TTFT holds the other's whole answer, so the answer is 1 whatever the machine's speed.
    server = start_llama_server("smollm2-1slot", 1, tmp_path)
    try:
        calib = loadgen("sweep", "--url", server.url, *WORKLOAD, "--concurrency", "1", "--requests", "8",
                        "--output", tmp_path / "c1")
        assert calib.returncode == 0, calib.stderr
        c1 = json.loads((tmp_path / "c1" / "run.json").read_text())["targets"][0]["levels"][0]
        slo = ("--slo", f"ttft={c1['ttft_ms']['max'] + c1['predicted_ms_mean'] / 2:.0f}ms")
        cap = loadgen("capacity", "--url", server.url, *WORKLOAD, *slo, "--max-concurrency", "4", "--format", "json",
                      "--output", tmp_path / "cap")
        assert cap.returncode == 0, cap.stderr
        result = json.loads(cap.stdout)["capacity"]
        sweep = loadgen("sweep", "--url", server.url, *WORKLOAD, *slo, "--concurrency", "1,2",
                        "--output", tmp_path / "all")
        assert sweep.returncode == 0, sweep.stderr
    finally:
        server.stop()
    doc = json.loads((tmp_path / "cap" / "run.json").read_text())
    assert doc["config"]["workload"] == json.loads((tmp_path / "all" / "run.json").read_text())["config"]["workload"]
    prompts = [json.loads(line)["prompt_n"] for line in (tmp_path / "cap" / "requests.jsonl").open()]
    assert len(set(prompts)) > 3 and all(80 <= n <= 160 for n in prompts), prompts  # drawn, each exact
    swept = json.loads((tmp_path / "all" / "run.json").read_text())["targets"][0]["levels"]
    passing = [lv["level"] for lv in swept if lv["slo"]["passed"]]
    print(slo, result["verdict"], [(lv["level"], lv["slo"]["attainment"]) for lv in swept])
    assert result["feasible_max"] == 1 and passing == [1], (result["verdict"], passing)
    assert result["binding"] == "ttft", result["verdict"]
