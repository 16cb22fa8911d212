"""The interference scenario on a real 1-slot llama-server (issue 35): the chat's TTFT alone and
beside the agent, and the verdict naming the agent's prefills. Bounded: the scenario's classes cut
to a 512-token agent (2 requests per phase) and a 64-token chat (4), 4 tokens generated each, no
warm-up (about 30 s on a loaded 2-core test bed, where the model reads ~70 prompt tok/s)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from loadgen.results.reader import load_records, load_run
from servers import LOADGEN, start_llama_server

pytestmark = pytest.mark.real

SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "interference.toml"
CLASSES = ('class=[{name="agent",prompt_tokens=512,n_predict=4,requests=2},'
           '{name="chat",prompt_tokens=64,n_predict=4,requests=4,slo="ttft=3s"}]')


def test_the_interference_scenario_names_the_agents_prefills_on_one_slot(tmp_path):
    server = start_llama_server("smollm2-1slot", 1, tmp_path)  # --parallel 1 -c 4096 -t 1
    out = tmp_path / "run"
    try:
        proc = subprocess.run([*LOADGEN, "run", str(SCENARIO), "--set", f"url={server.url}", "--set", f"output={out}",
                               "--set", "warmup=0", "--set", CLASSES], capture_output=True, text=True, timeout=280)
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr
    doc = load_run(out)
    t = doc.targets[0]
    levels = {(lv.request_class, lv.phase): lv for lv in t.levels}
    assert set(levels) == {("agent", "alone"), ("chat", "alone"), ("agent", "together"), ("chat", "together")}
    records = load_records(out)
    assert all(r.ok for r in records)
    # every prompt is cut to its class's length with the server's own tokenizer
    assert {r.prompt_n for r in records if r.request_class == "agent"} == {512}
    assert {r.prompt_n for r in records if r.request_class == "chat"} == {64}
    chat_alone, chat_beside = levels["chat", "alone"].ttft_ms, levels["chat", "together"].ttft_ms
    verdict = {v.request_class: v for v in t.interference}
    print(f"\nchat TTFT p50 {chat_alone.p50:.0f} ms alone, {chat_beside.p50:.0f} ms beside the agent; "
          f"agent prompt_ms mean {levels['agent', 'together'].prompt_ms_mean:.0f} ms")
    for v in t.interference:
        print(v.line)
    assert chat_beside.p50 > 1.5 * chat_alone.p50
    assert (verdict["chat"].held_by, verdict["chat"].held_with) == ("agent", "prefills")
    assert "agent's 512-token prefills hold the 1 slot" in verdict["chat"].line
    assert verdict["chat"].line in proc.stdout
