"""The environment record against the real llama-server test bed: `loadgen env --url` names its build,
model and slots from /props, and a sweep stores them with the machine's fingerprint and per-level samples."""

from __future__ import annotations

import json

import pytest

from servers import in_process_cli, start_llama_server

pytestmark = pytest.mark.real


def test_env_and_a_sweep_record_the_real_servers_build(tmp_path, monkeypatch, capsys):
    loadgen = in_process_cli(monkeypatch, capsys)
    server = start_llama_server("env-real", 2, tmp_path)
    try:
        code, out, err = loadgen("env", "--url", server.url, "--interval", "0.2", "--connections", "2")
        assert code == 0, err
        line = next(line for line in out.splitlines() if line.startswith(f"server {server.url}"))
        assert ", 2 slots of " in line and "build b" in line  # llama-server's build_info is "b<number>-<commit>"
        code, _, err = loadgen("sweep", "--url", server.url, "--concurrency", "1,2", "--requests", "4",
                               "--n-predict", "8", "--output", tmp_path / "run", "--env-interval", "0.2")
        assert code == 0, err
    finally:
        server.stop()
    doc = json.loads((tmp_path / "run" / "run.json").read_text())
    env = doc["environment"]
    assert env["server"]["env-real"]["total_slots"] == 2 and env["server"]["env-real"]["build_info"]
    assert env["cpu"]["logical_cores"] >= 1 and env["kernel"]
    for level in doc["targets"][0]["levels"]:
        assert len(level["environment"]) >= 2  # its start and its end at least
        assert all(s["cpu_times"]["total_jiffies"] > 0 for s in level["environment"])
