"""The HTTP layer (issue 32): a server whose HTTP threads are all held by keep-alive connections
makes requests wait before its slots or deferred queue know of them. The simulator's
`--threads-http N` is such a fixed pool; loadgen must name that wait, keep it out of the queue
wait and the knee, and never cause it with its own probe."""

from __future__ import annotations

import pytest

from loadgen.results.reader import load_run_dict
from servers import SimProcess, sweep


def run(tmp_path, sim, *args):
    out = tmp_path / "run"
    proc = sweep("--url", sim.url, "--n-predict", "16", "--warmup", "1", "--no-histograms", "--output", str(out),
                 *args, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return load_run_dict(out)["targets"][0]["verdict"], proc.stdout


def test_requests_held_by_the_http_layer_are_named_and_kept_out_of_the_knee(tmp_path):
    # 4 slots, 2 HTTP threads: at c=4 two connections hold both threads for as long as they send,
    # and the other two wait (with 2 slots free) until the first two have been idle for 1 s
    with SimProcess("--profile", "smoke", "--slots", "4", "--threads-http", "2", "--keep-alive-timeout", "1") as sim:
        verdict, stdout = run(tmp_path, sim, "--concurrency", "1,4", "--requests", "12")
    c4 = verdict["levels"][1]
    assert c4["evidence"] == "records" and c4["queue_cause"] == "outside"
    assert c4["held_outside"] == 2 and c4["held_outside_max_ms"] > 1000  # the keep-alive timeout at least
    assert c4["slot_queued"] == 0 and c4["slot_wait_ms"] is None  # none of it is queue wait
    assert verdict["knee"] is None  # throughput fell, but not because the slots ran out
    lines = verdict["verdict"]
    assert any(line.startswith("smoke-sim at c=4: 2 of 12 requests waited up to ") and
               line.endswith(" outside the server.") for line in lines), lines
    assert "smoke-sim: its HTTP threads ran out: raise --threads-http or open fewer connections." in lines
    assert not any("waited for a slot" in line or "saturates" in line for line in lines), lines


@pytest.mark.parametrize("concurrency", ["1", "1,2"])
def test_the_probe_never_takes_the_thread_a_request_needs(tmp_path, concurrency):
    # As many HTTP threads as request connections: a probe that kept connections of its own would
    # hold one, and a request would wait out the keep-alive timeout (10 s here) for it. (Here the
    # probe waits for a thread instead: a request connection never idles for 10 s during a level.)
    threads = concurrency.split(",")[-1]
    with SimProcess("--profile", "smoke", "--slots", "2", "--threads-http", threads,
                    "--keep-alive-timeout", "10") as sim:
        verdict, _ = run(tmp_path, sim, "--concurrency", concurrency, "--requests", "16")
    for level in verdict["levels"]:
        # a busy machine can delay a request by some ms; the probe's hold would be the 10 s timeout
        assert level["evidence"] == "records" and (level["held_outside_max_ms"] or 0) < 250, level
    assert not any("HTTP threads" in line for line in verdict["verdict"]), verdict["verdict"]
