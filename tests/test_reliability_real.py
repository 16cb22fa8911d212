"""A real llama-server killed in the middle of a level: the run ends with every record kept.

Starts its own server (never the shared session ones) and kills it by pid.
"""

from __future__ import annotations

import signal
import subprocess
import time
import urllib.request

import pytest

from loadgen.results.reader import load_records, load_run_dict
from servers import LOADGEN, start_llama_server

pytestmark = pytest.mark.real

N_PREDICT = 16


def completed(url: str) -> int:
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return -1
    total = next(float(line.split()[1]) for line in text.splitlines()
                 if line.startswith("llamacpp:tokens_predicted_total "))
    return int(total) // N_PREDICT


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_llama_server_killed_mid_level(tmp_path, stream):
    server = start_llama_server(f"rel-kill-{'stream' if stream else 'json'}", 2, tmp_path)
    out = tmp_path / "run"
    try:
        proc = subprocess.Popen([*LOADGEN, "sweep", "--url", server.url, "--concurrency", "1,2", "--requests", "40",
                                 "--n-predict", str(N_PREDICT), "--warmup", "1", "--no-histograms",
                                 *(["--stream"] if stream else []), "--output", str(out)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # 4 requests into level c=1 (after the warm-up): kill it there
        deadline = time.monotonic() + 120
        while completed(server.url) < 1 + 4:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.02)
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait(10)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        server.stop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, stderr
    assert "Traceback" not in stderr
    doc, records = load_run_dict(out), load_records(out)
    assert doc["complete"] is False and doc["interrupted"] is False
    target = doc["targets"][0]
    assert "target down" in target["error"] and target["error"].endswith("at concurrency 1")
    assert [lv["level"] for lv in target["levels"]] == [1]  # level c=2 never started
    cut = target["levels"][0]
    assert cut["stopped_reason"].startswith("target down")
    assert sorted(r.seq for r in records) == list(range(len(records)))  # every request once
    assert cut["requests_ok"] + cut["requests_failed"] + cut["requests_cancelled"] == len(records)
    assert cut["output_tokens"] == sum(r.output_tokens for r in records if r.ok) == N_PREDICT * cut["requests_ok"]
    # The server counts a request done before its answer reaches loadgen: at c=1 the fourth may still
    # be on its way when the server dies (then it is recorded as disconnected, not lost).
    assert cut["requests_ok"] >= 3
    failed = [r for r in records if not r.ok]
    assert {r.error_kind for r in failed} <= {"disconnected", "connect_error", "truncated_stream"}
    assert [r.error_kind for r in failed][-3:] == ["connect_error"] * 3  # then it was called down
    assert "not trustworthy" in stdout
    assert f"{target['label']}: {target['error']}" in stderr
