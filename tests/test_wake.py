"""`loadgen wake` (analysis/wake.py's verdict, run/wake.py's refusals): the rule on a table of cycles
whose answers were written before the rule ran, and the server that cannot be measured refused in
one line. The real server's wakes: tests/test_wake_real.py."""

from __future__ import annotations

import http.server
import json

import pytest

from loadgen.analysis.wake import FAILED, INTERRUPTED, NO_COST, NO_SLEEP, WAKE_COSTS, wake_section, wake_verdict
from loadgen.core.rundoc import WakeCycle
from servers import SimThread, serve_handler


def cycle(i=1, slept=True, warm=10.0, cold=510.0, failed=0, **kw) -> WakeCycle:
    """A cycle by its waits outside the prefill (TTFT less prompt_ms), warm and cold."""
    return WakeCycle(cycle=i, slept=slept, slept_after_s=1.2 if slept else None, warm_ttft_ms=400 + warm,
                     cold_ttft_ms=None if cold is None or not slept else 400 + cold, warm_wait_ms=warm,
                     cold_wait_ms=cold if slept else None, failed=failed,
                     error="http_503: Loading model" if failed else None, **kw)


# (cycles, the verdict, the wake cost in ms or None), written before the rule ran.
TABLE = [
    ([], FAILED, None),
    ([cycle(slept=False)], NO_SLEEP, None),
    ([cycle(warm=10, cold=510)], WAKE_COSTS, 500.0),
    ([cycle(warm=10, cold=40)], NO_COST, 30.0),  # under the 50 ms floor
    ([cycle(warm=300, cold=550)], NO_COST, 250.0),  # not twice the warm wait
    ([cycle(warm=10, cold=510, failed=1)], FAILED, None),  # a request failed around the wake
    ([cycle(1, warm=10, cold=610), cycle(2, slept=False)], WAKE_COSTS, 600.0),  # the slept cycle decides
    ([cycle(1, warm=10, cold=None)], FAILED, None),  # slept, but no cold wait to compare
    ([cycle(1, cold=510), cycle(2, cold=710), cycle(3, cold=310)], WAKE_COSTS, 500.0),  # the median of 3 costs
    ([cycle(1, warm=10, cold=0)], NO_COST, -10.0),  # a cold request waiting less than warm: no cost
]


@pytest.mark.parametrize("cycles,verdict,cost", TABLE)
def test_the_verdict_table(cycles, verdict, cost):
    got, why, got_cost = wake_verdict(cycles, 30)
    assert (got, got_cost) == (verdict, cost), why
    assert why


def test_an_interrupted_run_is_judged_on_the_cycles_that_ended():
    assert wake_verdict([], 30, interrupted=True)[0] == INTERRUPTED  # a Ctrl-C in cycle 1: not "no cycle ran"
    section = wake_section([cycle(1)], 1, 30, interrupted=True)
    assert section.verdict == WAKE_COSTS and "stopped after 1 cycle(s)" in section.why


def test_the_why_says_the_cost_and_the_servers_prefill():
    rows = [cycle(1, warm_prompt_ms=40.0, cold_prompt_ms=42.0), cycle(2, cold=710, warm_prompt_ms=40.0,
                                                                       cold_prompt_ms=44.0)]
    section = wake_section(rows, 2, 10)
    assert (section.verdict, section.wakes, section.wake_ms, section.concurrency) == (WAKE_COSTS, 2, 600.0, 2)
    assert "waits 600 ms more" in section.why and "prompt_ms cold 43, warm 40 ms" in section.why
    assert "no sleep" not in section.why


def test_never_sleeping_names_the_flag():
    _, why, _ = wake_verdict([cycle(slept=False)], 12)
    assert "--idle 12 s" in why and "--sleep-idle-seconds" in why


class NoSleepProps(http.server.BaseHTTPRequestHandler):
    """A server whose /props says nothing of sleep (another server, an older llama-server)."""

    def do_GET(self):  # noqa: N802 - http.server's name
        body = json.dumps({"status": "ok"} if self.path == "/health" else {"total_slots": 1}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_server_that_says_nothing_of_sleep_is_one_line(loadgen, tmp_path):
    with serve_handler(NoSleepProps) as url:
        code, _, err = loadgen("wake", "--url", url, "--cycles", "1", "--idle", "1", "--output", tmp_path / "w")
    assert code == 1, err
    assert "says nothing of sleep" in err and "--sleep-idle-seconds" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "w").exists()


def test_a_server_that_never_sleeps_is_said_so(loadgen, tmp_path):
    from loadgen.results.reader import load_records, load_run_dict

    with SimThread(slots=2) as sim:  # the simulator says is_sleeping false and never sleeps
        code, out, err = loadgen("wake", "--url", sim.url, "--cycles", "2", "--idle", "0.5", "--concurrency", "2",
                                 "--output", tmp_path / "w")
    assert code == 0, err
    doc = load_run_dict(tmp_path / "w")
    assert doc["kind"] == "wake"
    section = doc["targets"][0]["wake"]
    assert section["verdict"] == NO_SLEEP and section["wakes"] == 0
    assert [r["slept"] for r in section["rows"]] == [False, False]
    assert len(load_records(tmp_path / "w")) == 4  # the warm requests only: no cold ones without a sleep
    assert "no sleep" in out
