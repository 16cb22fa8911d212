"""`loadgen wake` against the test bed's llama-server started with --sleep-idle-seconds: each cycle
sees the server sleep, the cold requests wait for the model's reload (the server's own log says it
reloaded), and the server's prefill is what it was warm."""

from __future__ import annotations

import pytest

from loadgen.analysis.wake import WAKE_COSTS
from loadgen.results.reader import load_records, load_run_dict
from servers import start_llama_server

pytestmark = pytest.mark.real


def test_each_cycle_sleeps_and_the_cold_requests_wait_for_the_reload(loadgen, tmp_path):
    server = start_llama_server("wake", 2, tmp_path, extra=("--sleep-idle-seconds", "1"))
    try:
        code, out, err = loadgen("wake", "--url", server.url, "--cycles", "2", "--concurrency", "2", "--idle", "15",
                                 "--n-predict", "4", "--output", tmp_path / "w")
        log = server.log.read_text(errors="replace")
    finally:
        server.stop()
    assert code == 0, err
    section = load_run_dict(tmp_path / "w")["targets"][0]["wake"]
    rows = section["rows"]
    assert [r["slept"] for r in rows] == [True, True], rows
    assert all(r["awake_after"] is True and r["failed"] == 0 and r["requests_ok"] == 4 for r in rows), rows
    # The server reloaded its model once per wake (and once more if it slept before the first cycle:
    # woken by the start's /slots and /metrics reads, or by one burst loadgen sends first).
    assert log.count("server is exiting sleeping state") in (2, 3), log[-2000:]
    records = load_records(tmp_path / "w")
    assert len(records) in (8, 10) and all(r.ok for r in records)
    # A reload costs the cold requests far more than a prefill of a few tokens: the verdict says so,
    # and the server's own prefill is not where the time went.
    assert section["verdict"] == WAKE_COSTS, section["why"]
    assert section["wakes"] == 2 and section["wake_ms"] > 50
    for r in rows:
        assert r["cold_ttft_ms"] - r["warm_ttft_ms"] > r["cold_prompt_ms"] - r["warm_prompt_ms"]
    assert "wake costs" in out
