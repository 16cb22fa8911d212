"""`loadgen demo`: the README's first command, end to end in a subprocess."""

from __future__ import annotations

import subprocess

from loadgen.results.reader import load_probe, load_records, load_run_dict
from servers import LOADGEN


def test_demo_sweeps_two_simulators_and_gives_a_verdict_for_each(tmp_path):
    proc = subprocess.run([*LOADGEN, "demo", "--output", str(tmp_path / "demo")], capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr
    doc = load_run_dict(tmp_path / "demo")
    assert doc["kind"] == "demo" and doc["complete"] is True
    moe, dense = doc["targets"]
    assert (moe["label"], dense["label"]) == ("moe-35b-a3b", "dense-27b")
    for t in (moe, dense):
        assert [lv["concurrency"] for lv in t["levels"]] == [1, 2, 4, 8]
        # Below its 4 slots a server of this shape never defers a request, by its own /metrics.
        # (Whether a request's wait looked like queuing from the client's side is not asserted: on
        # a loaded machine a simulator process's scheduling delay, ×17 in simulated time, is a wait
        # too, and the verdict then says it was not for a slot.)
        below = [v for v in t["verdict"]["levels"] if v["level"] < 4]
        assert [v["level"] for v in below] == [1, 2] and all(v["peak_deferred"] == 0 for v in below), below
        assert t["verdict"]["saturated_at"] == 4  # = its 4 slots, as in the field report
        assert f"{t['label']} saturates at concurrency 4 = its 4 slots." in proc.stdout
    # the field report measured the MoE 3.71-4.63x ahead at every level
    for a, b in zip(moe["levels"], dense["levels"]):
        assert 3.3 < a["throughput_tok_s"] / b["throughput_tok_s"] < 5.0
    # figures are in simulated time: single-stream decode near the profile's 47.6 and 11.7 tok/s
    assert 40 < moe["levels"][0]["decode_tok_s_mean"] < 55
    assert 9 < dense["levels"][0]["decode_tok_s_mean"] < 14

    # one time axis in simulated time: each target's levels follow each other
    for label in ("moe-35b-a3b", "dense-27b"):
        samples = [p for p in load_probe(tmp_path / "demo") if p.target == label]
        assert all(a.t_ns <= b.t_ns and a.level <= b.level for a, b in zip(samples, samples[1:]))
        records = [r for r in load_records(tmp_path / "demo") if r.target == label]
        for lower, upper in ((1, 2), (2, 4), (4, 8)):
            assert max(r.complete_ns for r in records if r.level == lower) <= min(
                r.send_ns for r in records if r.level == upper)
