"""Exact prompt lengths, prefill, depth and soak against real llama-servers from the test bed.

Each test is kept short: the whole real suite shares 2 cores and a 90-minute CI budget.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from loadgen.core import records as record_kinds
from loadgen.results.reader import load_records, load_run_dict
from servers import LOADGEN, start_llama_server

pytestmark = pytest.mark.real

SMOKE = Path(__file__).resolve().parent.parent / "scenarios" / "smoke.toml"


def loadgen(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([*LOADGEN, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def test_smoke_scenario_with_prompt_tokens_256_is_exact_on_every_request(real_servers, tmp_path):
    four, _ = real_servers
    out = tmp_path / "smoke"
    proc = loadgen("run", SMOKE, "--set", f"url={four.url}", "--set", "prompt_tokens=256", "--set", f"output={out}")
    assert proc.returncode == 0, proc.stderr
    records = load_records(out)
    assert len(records) == 8 and all(r.ok for r in records)
    assert all(abs(r.prompt_n - 256) <= 1 and r.prompt_tokens_target == 256 for r in records), \
        [r.prompt_n for r in records]
    assert all(r.cache_n == 0 for r in records) and len({r.salt for r in records}) == 8


def test_prefill_reports_a_longer_prompt_taking_longer(real_servers, tmp_path):
    _, one = real_servers
    out = tmp_path / "prefill"
    proc = loadgen("prefill", "--url", one.url, "--prompt-tokens", "128,512", "--repeat", "1", "--warmup", "0",
                   "--output", out)
    assert proc.returncode == 0, proc.stderr
    rows = {r["prompt_tokens"]: r for r in load_run_dict(out)["targets"][0]["prefill"]["rows"]}
    for n in (128, 512):
        assert rows[n]["requests_ok"] == 1 and abs(rows[n]["prompt_n"]["mean"] - n) <= 1
        assert rows[n]["prompt_tok_s"]["mean"] > 0 and rows[n]["ttft_ms"]["mean"] >= rows[n]["prompt_ms"]["mean"]
    assert rows[512]["prompt_ms"]["mean"] > rows[128]["prompt_ms"]["mean"]
    assert "prompt tok/s" in proc.stdout


def test_depth_reports_both_depths_and_skips_one_past_a_slots_context(real_servers, tmp_path):
    four, one = real_servers  # one: 1 slot of 4096 tokens; four: 4 slots of 1024
    out = tmp_path / "depth"
    proc = loadgen("depth", "--url", one.url, "--url", four.url, "--depths", "0,1024", "--n-predict", "16",
                   "--repeat", "1", "--warmup", "0", "--output", out)
    assert proc.returncode == 0, proc.stderr
    doc = load_run_dict(out)
    by_label = {t["label"]: t["depth"] for t in doc["targets"]}
    deep = {r["depth"]: r for r in by_label[one.alias]["rows"]}
    assert by_label[one.alias]["n_ctx"] == 4096
    for d in (0, 1024):
        assert deep[d]["requests_ok"] == 1 and deep[d]["decode_tok_s"]["mean"] > 0 and deep[d]["skipped"] is None
    assert abs(deep[1024]["prompt_n"]["mean"] - 1024) <= 1
    assert deep[0]["change"] == 0 and deep[1024]["change"] is not None
    shallow = {r["depth"]: r for r in by_label[four.alias]["rows"]}
    assert by_label[four.alias]["n_ctx"] == 1024
    assert shallow[0]["requests_ok"] == 1
    assert shallow[1024]["skipped"] == "skipped: prompt 1,024 + n_predict 16 > per-slot n_ctx 1,024"
    assert "per-slot n_ctx 1,024" in proc.stdout


def test_a_soak_checkpoints_and_rides_out_a_server_restart(tmp_path):
    server = start_llama_server("soak-victim", 1, tmp_path)
    out = tmp_path / "soak"
    proc = subprocess.Popen([*LOADGEN, "soak", "--url", server.url, "--concurrency", "2", "--duration", "20s",
                             "--checkpoint-interval", "4s", "--n-predict", "8", "--warmup", "1", "--slo", "e2e=30s",
                             "--output", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    checkpoints: set[tuple[int, int]] = set()
    run_json = out / "run.json"

    def watch(until: float) -> None:
        while time.monotonic() < until and proc.poll() is None:
            try:
                st = run_json.stat()
                checkpoints.add((st.st_ino, st.st_mtime_ns))
            except FileNotFoundError:
                pass
            time.sleep(0.05)

    try:
        deadline = time.monotonic() + 120
        while not checkpoints and time.monotonic() < deadline and proc.poll() is None:
            watch(time.monotonic() + 0.2)  # the first checkpoint: the soak is 4 s in
        server.proc.kill()  # the server goes away mid-request
        server.proc.wait(10)
        watch(time.monotonic() + 2)
        server = start_llama_server("soak-victim", 1, tmp_path, port=server.port)  # ... and comes back
        watch(time.monotonic() + 120)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        server.stop()
    assert proc.returncode == 0, stderr
    assert len(checkpoints) >= 2, checkpoints  # written while it ran, not only at the end
    doc = load_run_dict(out)
    soak = doc["targets"][0]["soak"]
    assert doc["complete"] is True and doc["targets"][0]["error"] is None
    assert soak["requests_failed"] >= 1
    assert set(soak["errors_by_kind"]) <= {record_kinds.CONNECT_ERROR, record_kinds.DISCONNECTED, "http_503"}
    records = sorted(load_records(out), key=lambda r: r.complete_ns)
    last_failure = max(i for i, r in enumerate(records) if not r.ok)
    assert sum(1 for r in records[last_failure:] if r.ok) >= 3  # the load resumed after the restart
    assert soak["error_free_s"] < soak["duration_s"] and soak["longest_error_free_s"] > 0
    assert "connect_error" in stderr or "disconnected" in stderr  # the status line counted them
    # --slo e2e=30s: the restart's failures miss (errors always do), the windows they fell in fall
    # below 100%, and the counts are those of the records judged again.
    from loadgen.analysis.slo import judge, parse_slo

    judged = [r for r in records if r.error_kind not in record_kinds.CLIENT_SIDE]
    good = sum(1 for r in judged if not judge(r, parse_slo("e2e=30s")))
    assert (soak["slo"]["judged"], soak["slo"]["good"]) == (len(judged), good)
    assert soak["slo"]["judged"] == soak["requests_ok"] + soak["requests_failed"] > soak["slo"]["good"]
    assert all(w["attainment"] < 1 for w in soak["windows"] if w["requests_failed"])
    assert sum(w["good"] for w in soak["windows"]) == good
    print(f"soak --slo e2e=30s through a restart: attainment {soak['slo']['attainment']:.3f} "
          f"({good} of {len(judged)}), per window {[w['attainment'] for w in soak['windows']]}, "
          f"falling={soak['slo']['falling']} (p={soak['slo']['falling_p']})")
