"""`loadgen sweep` against real llama-servers from the test bed (scripts/testbed)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import defaultdict

import pytest

from loadgen.analysis import metrics
from loadgen.results.reader import load_records, load_run_dict
from servers import LOADGEN, start_llama_server

pytestmark = pytest.mark.real



def test_every_request_is_uncached_and_distinctly_salted(two_server_sweep):
    _, doc, records = two_server_sweep
    assert len(records) == sum(lv["requests_ok"] for t in doc["targets"] for lv in t["levels"])
    assert all(r.ok for r in records)
    assert all(r.cache_n == 0 for r in records)
    assert len({r.salt for r in records}) == len(records)
    assert all(r.predicted_n == 16 and r.stop_type == "limit" for r in records)


def test_labels_levels_and_default_request_budget(two_server_sweep):
    proc, doc, _ = two_server_sweep
    assert [t["label"] for t in doc["targets"]] == ["smollm2-4slot", "smollm2-1slot"]
    for t in doc["targets"]:
        assert [lv["concurrency"] for lv in t["levels"]] == [1, 2, 4]
        assert [lv["requests_ok"] for lv in t["levels"]] == [8, 8, 16]  # max(8, 4×C)
        assert t["server"]["props"]["total_slots"] in (1, 4)
        assert all(lv["throughput_tok_s"] > 0 for lv in t["levels"])
    assert doc["complete"] is True
    assert "tok/s ratio: smollm2-4slot ÷ smollm2-1slot" in " ".join(proc.stdout.split())  # the ratio column's caption


def test_the_sweep_writes_hgrm_histograms_next_to_run_json(two_server_sweep, tmp_path_factory):
    _, doc, _ = two_server_sweep
    out = next(p for p in tmp_path_factory.getbasetemp().glob("sweep*/run"))
    names = {p.name for p in (out / "histograms").glob("*.hgrm")}
    for t in doc["targets"]:
        for lv in t["levels"]:
            assert f"{t['label']}-c{lv['concurrency']}-latency.hgrm" in names
    lines = (out / "histograms" / "smollm2-1slot-c4-latency.hgrm").read_text().splitlines()
    assert lines[0].split() == ["Value", "Percentile", "TotalCount", "1/(1-Percentile)"]
    rows = [line.split() for line in lines[2:] if line.strip() and not line.startswith("#")]
    c4 = next(lv for t in doc["targets"] if t["label"] == "smollm2-1slot" for lv in t["levels"] if lv["concurrency"] == 4)
    assert float(rows[-1][0]) == pytest.approx(c4["latency_ms"]["max"], abs=0.002)  # 100% row = run.json max
    assert int(rows[-1][2]) == c4["requests_ok"]


def test_output_tokens_match_the_servers_own_counter(two_server_sweep):
    _, doc, records = two_server_sweep
    by_level = defaultdict(int)
    for r in records:
        by_level[(r.target, r.level)] += r.predicted_n
    for t in doc["targets"]:
        for lv in t["levels"]:
            counted = lv["server_metrics_delta"]["llamacpp:tokens_predicted_total"]
            assert by_level[(t["label"], lv["concurrency"])] == lv["output_tokens"] == counted


def test_one_slot_server_queues_requests_at_concurrency_4(two_server_sweep):
    _, _, records = two_server_sweep
    burst = [r for r in records if r.target == "smollm2-1slot" and r.level == 4]
    queued = [r for r in burst if metrics.queue_wait_ms(r) > 0.5 * metrics.service_ms(r)]
    # closed loop, 4 workers, 1 slot: every request but the first waits for others to finish
    assert len(queued) >= 0.75 * len(burst)
    four_slot = [r for r in records if r.target == "smollm2-4slot" and r.level == 4]
    assert len({r.id_slot for r in four_slot}) > 1  # several slots actually served requests


def _a_level_saved(out) -> bool:
    """run.json (written from the run's start) holds a finished level: the first checkpoint."""
    try:
        doc = json.loads((out / "run.json").read_text())
    except (OSError, ValueError):
        return False
    return any(lv.get("stopped_reason") != "in progress" for t in doc["targets"] for lv in t.get("levels") or [])


def test_killing_a_server_mid_sweep_keeps_the_other_targets_levels(real_servers, tmp_path):
    four, _ = real_servers
    victim = start_llama_server("victim", 1, tmp_path)
    out = tmp_path / "run"
    try:
        proc = subprocess.Popen([*LOADGEN, "sweep", "--url", victim.url, "--url", four.url, "--concurrency", "1,2,4",
                                 "--n-predict", "16", "--requests", "8", "--no-histograms", "--output", str(out)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while not _a_level_saved(out) and time.monotonic() < deadline:  # first level done
            time.sleep(0.05)
        victim.proc.kill()
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        victim.stop()
    assert proc.returncode == 1, stderr
    assert victim.url in stderr and "Traceback" not in stderr
    doc = load_run_dict(out)
    assert doc["complete"] is False
    dead, alive = doc["targets"]
    assert dead["error"] and victim.url in dead["error"]
    assert dead["levels"][0]["requests_ok"] == 8
    assert [lv["concurrency"] for lv in alive["levels"]] == [1, 2, 4]
    assert all(lv["requests_failed"] == 0 and lv["requests_ok"] == 8 for lv in alive["levels"])
    records = load_records(out)
    assert sum(1 for r in records if r.target == dead["label"] and not r.ok) >= 1
    assert not (out / "histograms").exists()  # --no-histograms


@pytest.mark.parametrize("signum,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_cancels_in_flight_requests_and_keeps_a_valid_incomplete_run(real_servers, tmp_path, signum, code):
    _, one = real_servers
    out = tmp_path / "run"
    proc = subprocess.Popen([*LOADGEN, "sweep", "--ports", str(one.port), "--concurrency", "1,4", "--requests", "12",
                             "--n-predict", "32", "--output", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not _a_level_saved(out) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # inside level 2, with requests in flight
    os.kill(proc.pid, signum)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == code, stderr
    assert "Traceback" not in stderr
    doc = load_run_dict(out)
    assert doc["complete"] is False and doc["interrupted"] is True
    levels = doc["targets"][0]["levels"]
    assert levels[0]["requests_ok"] == 12
    assert levels[1]["stopped_reason"] == "interrupted"
    assert levels[1]["requests_cancelled"] >= 1
    records = load_records(out)
    assert json.loads((out / "run.json").read_text())  # parseable, not half-written
    assert len(records) == sum(lv["requests_ok"] + lv["requests_failed"] + lv["requests_cancelled"] for lv in levels)
