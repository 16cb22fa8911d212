"""Open-loop verdicts on simulators whose service rate the test measures first (issue #46, 1): one
level below the service rate keeps up, one at it does not keep up, one at twice it is overloaded, and
a trace replayed at ten times the server's rate is overloaded, each with the served rate.

Expected answers, written before the runs: 0.4x -> keeps_up; 1x -> at_limit or overloaded (at the
service rate a queue of random arrivals never settles; never "keeps up"); 2x -> overloaded with a
served rate near the service rate; a replay at 10x -> overloaded, served near the service rate."""

from __future__ import annotations

import json
import subprocess

from loadgen.results.reader import load_run_dict
from servers import LOADGEN, SimProcess, sweep

# One slot, exactly 40 tokens an answer at 2 ms a token: about 12 requests a second, whatever the
# sampled text (--ignore-eos).
SIM = ("--profile", "smoke", "--slots", "1")
ANSWER = ("--n-predict", "40", "--ignore-eos")


def _service_rate(url: str, out) -> float:
    """Requests a second one client back to back gets: the one slot's service rate."""
    proc = sweep("--url", url, "--concurrency", "1", "--requests", "12", *ANSWER, "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    return load_run_dict(out)["targets"][0]["levels"][0]["request_rate"]


def _judged(doc: dict) -> dict:
    return {lv["level"]: lv["open_loop"] for lv in doc["targets"][0]["verdict"]["levels"]}


def test_below_at_and_above_the_service_rate(tmp_path):
    with SimProcess(*SIM) as sim:
        mu = _service_rate(sim.url, tmp_path / "closed")
        rates = [round(0.4 * mu, 2), round(mu, 2), round(2 * mu, 2)]
        proc = sweep("--url", sim.url, "--rate", ",".join(map(str, rates)), "--requests", "40", *ANSWER,
                     "--seed", "3", "--output", str(tmp_path / "open"))
    assert proc.returncode == 0, proc.stderr
    doc = load_run_dict(tmp_path / "open")
    judged = _judged(doc)
    below, at, above = (judged[r] for r in rates)
    assert below["verdict"] == "keeps_up", below
    assert at["verdict"] in ("at_limit", "overloaded"), at
    assert above["verdict"] == "overloaded", above
    assert 0.8 * mu < above["served_rate"] < 1.25 * mu, (mu, above)
    lines = doc["targets"][0]["verdict"]["verdict"]
    assert lines[0].startswith(f"smoke-sim keeps up at {rates[0]:g} req/s"), lines
    assert any(line.startswith(f"smoke-sim is overloaded at {rates[2]:g} req/s: served ") for line in lines), lines
    assert f"smoke-sim saturates between {rates[0]:g} req/s and {rates[1]:g} req/s" in " ".join(lines)
    assert "keeps up with every offered rate" not in proc.stdout


def test_a_trace_at_ten_times_the_server_s_rate_is_overloaded(tmp_path):
    with SimProcess(*SIM) as sim:
        mu = _service_rate(sim.url, tmp_path / "closed")
        gap_s = 1 / (10 * mu)
        trace = tmp_path / "t.jsonl"
        trace.write_text("".join(json.dumps({"time": i * gap_s, "input": 60, "output": 40}) + "\n"
                                 for i in range(30)))
        proc = subprocess.run([*LOADGEN, "replay", str(trace), "--url", sim.url, "--ignore-eos",
                               "--output", str(tmp_path / "replay")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    judged = next(iter(_judged(load_run_dict(tmp_path / "replay")).values()))
    assert judged["verdict"] == "overloaded", judged
    assert 0.7 * mu < judged["served_rate"] < 1.3 * mu, (mu, judged)
    assert "smoke-sim is overloaded replaying the trace: served " in proc.stdout
    assert "keeps up" not in proc.stdout
