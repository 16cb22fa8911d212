"""A plain web server as a sweep's target (issue 39): "not an LLM server" is the first line and the
only one about it, not preceded by "/metrics is off or unreadable ..." (expected output written first)."""

from __future__ import annotations

import subprocess
import sys

from servers import LOADGEN, free_port, wait_healthy


def test_a_plain_web_server_is_told_once(tmp_path):
    port = free_port()
    (tmp_path / "health").write_text("ok\n")  # so the stand-in answers /health as a server that is up
    web = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                            "--directory", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_healthy(f"http://127.0.0.1:{port}/", 30, web, "the web server")
        proc = subprocess.run([*LOADGEN, "sweep", "--url", f"http://127.0.0.1:{port}", "--concurrency", "1",
                               "--requests", "2", "--n-predict", "4", "--output", str(tmp_path / "run")],
                              capture_output=True, text=True, timeout=120)
    finally:
        web.terminate()
        web.wait(timeout=30)
    lines = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("results:")]
    assert proc.returncode == 1
    assert lines and "not an LLM server" in lines[0], proc.stderr
    assert "/metrics is off" not in proc.stderr
