"""Saved and restored slots on a real llama-server (issue 51), build 11434 with --slot-save-path and
2 slots: save -> erase -> restore -> the next turn reuses the whole file (n_saved = the prompt's P
tokens + the answer's n_predict less the last token, which never enters the cache), re-sending the
saved prompt itself reuses P - 1 (the issue's criterion: a prompt's last token is always
re-evaluated), the file holds n_written bytes, the erased control re-processes; under load on the
other slot the cycle still restores; a server without --slot-save-path stops the command before its
first cycle. The stand-in that "restores" but re-processes is tests/test_slots.py's."""

from __future__ import annotations

import json
import subprocess
import urllib.request

import pytest

from loadgen.analysis.slots import RESTORED
from loadgen.results.reader import load_run
from servers import LOADGEN, start_llama_server

pytestmark = pytest.mark.real

PROMPT_TOKENS, N_PREDICT = 400, 4
KV_BYTES_PER_TOKEN = 30 * 2 * 192 * 2  # SmolLM2-135M: 30 layers × (K, V) × 3 KV heads × 64 × f16


@pytest.fixture(scope="module")
def save_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("slot-save")


@pytest.fixture(scope="module")
def server(tmp_path_factory, save_dir):
    s = start_llama_server("smollm2-slots", 2, tmp_path_factory.mktemp("llama-logs"),
                           extra=("--slot-save-path", str(save_dir)))
    yield s
    s.stop()


def _slots(server, out, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([*LOADGEN, "slots", "--url", server.url, "--prompt-tokens", str(PROMPT_TOKENS),
                           "--n-predict", str(N_PREDICT), "--temperature", "0", "--seed", "1",
                           "--output", str(out), *flags], capture_output=True, text=True, timeout=600)


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        return json.loads(resp.read())


@pytest.mark.timeout(900)
def test_save_erase_restore_next_turn_reuses_the_whole_file(server, save_dir, tmp_path):
    proc = _slots(server, tmp_path / "slots", "--cycles", "2", "--slot-save-dir", str(save_dir))
    assert proc.returncode == 0, proc.stderr
    print(proc.stdout)
    section = load_run(tmp_path / "slots").targets[0].slots
    assert section is not None and len(section.rows) == 2
    for c in section.rows:
        assert c.verdict == RESTORED, c.why
        assert c.prompt_tokens == PROMPT_TOKENS  # cut with the server's tokenizer
        assert c.n_saved == c.prompt_tokens + N_PREDICT - 1 == c.n_restored
        # the answer comes back as text: its tokens may split otherwise at its edges (tests/test_cache_real.py)
        assert c.n_saved - 2 <= c.cache_n <= c.n_saved, (c.cache_n, c.n_saved)
        assert c.control_cache_n == 0 and c.control_ttft_ms > 2 * c.ttft_ms
        assert c.file_bytes == c.n_written == c.n_read
        assert KV_BYTES_PER_TOKEN <= c.bytes_per_token < KV_BYTES_PER_TOKEN * 1.05
    assert "restored" in proc.stdout and "bytes per token" in proc.stdout


@pytest.mark.timeout(600)
def test_the_saved_prompt_resent_after_a_restore_reuses_all_but_its_last_token(server):
    prompt = "[slots-real 73] " + "A saved conversation comes back from its file. " * 30
    body = {"prompt": prompt, "n_predict": N_PREDICT, "id_slot": 1, "cache_prompt": True, "temperature": 0}
    first = _post(f"{server.url}/completion", body)["timings"]
    prompt_tokens = first["prompt_n"] + first["cache_n"]
    saved = _post(f"{server.url}/slots/1?action=save", {"filename": "resent.bin"})
    assert saved["n_saved"] == prompt_tokens + N_PREDICT - 1
    assert _post(f"{server.url}/slots/1?action=erase", {})["n_erased"] == saved["n_saved"]
    assert _post(f"{server.url}/slots/1?action=restore", {"filename": "resent.bin"})["n_restored"] == saved["n_saved"]
    again = _post(f"{server.url}/completion", body)["timings"]
    assert again["cache_n"] == prompt_tokens - 1 and again["prompt_n"] == 1


@pytest.mark.timeout(900)
def test_cycles_under_load_on_the_other_slot_still_restore(server, tmp_path):
    proc = _slots(server, tmp_path / "load", "--cycles", "1", "--concurrency", "1")
    assert proc.returncode == 0, proc.stderr
    section = load_run(tmp_path / "load").targets[0].slots
    assert section is not None and section.concurrency == 1 and section.background_ok >= 1
    assert [c.cache_n is not None and c.cache_n >= c.prompt_tokens - 1 for c in section.rows] == [True]


@pytest.mark.timeout(300)
def test_a_server_without_slot_save_path_is_told_before_the_first_cycle(tmp_path):
    plain = start_llama_server("smollm2-no-save", 1, tmp_path)
    try:
        proc = subprocess.run([*LOADGEN, "slots", "--url", plain.url, "--output", str(tmp_path / "out")],
                              capture_output=True, text=True, timeout=120)
    finally:
        plain.stop()
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Start it with `--slot-save-path`" in lines[0], proc.stderr
    assert not (tmp_path / "out").exists()
