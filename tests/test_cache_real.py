"""Cache modes on a real llama-server (issue 36): a shared prefix is reused by every request after
its group's first (cache_n covers BOS + the prefix; llama-server reuses the whole common prefix of
a plain-attention model like SmolLM2, so the granularity allowed is 1 token) and not at all with
the mode's cache off; a 4 users × 5 turns conversation re-sends its history and turn k ≥ 2 reuses
the previous turn's whole prompt (less up to 2 tokens: the server's answer, re-sent as text, may
tokenize differently at its edges)."""

from __future__ import annotations

import subprocess

import pytest

from loadgen.analysis.cache import is_hit, turn_figures
from loadgen.results.reader import load_records, load_run_dict
from servers import LOADGEN, start_llama_server

pytestmark = pytest.mark.real

PREFIX, TOTAL, GROUPS, REQUESTS = 300, 360, 2, 8
GRANULARITY = 1  # tokens of the prefix the server may re-evaluate
RETOKENIZED = 2  # tokens of a re-sent answer that may tokenize differently


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = start_llama_server("smollm2-cache", 4, tmp_path_factory.mktemp("llama-logs"))
    yield s
    s.stop()


def _prefix_run(server, out, *flags):
    proc = subprocess.run([*LOADGEN, "prefix", "--url", server.url, "--prefix-tokens", str(PREFIX), "--groups",
                           str(GROUPS), "--prompt-tokens", str(TOTAL), "--requests", str(REQUESTS),
                           "--n-predict", "4", "--output", str(out), *flags],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    print(proc.stdout)
    return sorted(load_records(out), key=lambda r: r.seq)


@pytest.mark.timeout(900)
def test_a_shared_prefix_is_reused_after_each_groups_first_request_and_not_with_the_cache_off(server, tmp_path):
    records = _prefix_run(server, tmp_path / "on")
    assert len(records) == REQUESTS and all(r.ok for r in records)
    assert all(r.cache_n + r.prompt_n == TOTAL for r in records), [(r.cache_n, r.prompt_n) for r in records]
    later = records[GROUPS:]
    assert all(r.cache_n >= PREFIX - GRANULARITY for r in later), [r.cache_n for r in later]
    assert all(is_hit(r.cache_n, r.prompt_n) for r in later)
    level = load_run_dict(tmp_path / "on")["targets"][0]["levels"][0]
    assert level["ttft_cache_hit_ms"]["p50"] < level["ttft_cache_miss_ms"]["p50"]
    assert level["cache_hit_ratio"] > 0.5
    off = _prefix_run(server, tmp_path / "off", "--no-cache")
    assert {r.cache_n for r in off} == {0}
    assert load_run_dict(tmp_path / "off")["config"]["cache_prompt"] is False


@pytest.mark.timeout(900)
def test_four_users_five_turns_reuse_their_history(server, tmp_path):
    users, turns = 4, 5
    proc = subprocess.run([*LOADGEN, "chat", "--url", server.url, "--users", str(users), "--turns", str(turns),
                           "--message-tokens", "48", "--n-predict", "16", "--output", str(tmp_path / "chat")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    print(proc.stdout)
    assert "per turn" in proc.stdout
    records = load_records(tmp_path / "chat")
    assert len(records) == users * turns and all(r.ok for r in records)
    by_user: dict[int, list] = {}
    for r in sorted(records, key=lambda r: r.seq):
        by_user.setdefault(r.worker, []).append(r)
    for user, convo in by_user.items():
        whole = [r.cache_n + r.prompt_n for r in convo]
        assert whole == sorted(whole) and len(set(whole)) == turns, (user, whole)
        assert convo[0].cache_n <= 1
        for previous, current in zip(convo, convo[1:]):
            # The previous prompt and its answer, re-sent, are this prompt's start.
            assert current.cache_n >= previous.cache_n + previous.prompt_n - RETOKENIZED, (user, whole)
    figures = turn_figures((r.seq // users + 1, r) for r in records)
    assert [f.turn for f in figures] == list(range(1, turns + 1))
    assert figures[0].hit_ratio < 0.05 and all(f.hit_ratio > 0.5 for f in figures[1:])


@pytest.mark.timeout(900)
def test_cache_capacity_finds_where_reuse_collapses_with_a_small_cache_ram(tmp_path_factory, tmp_path):
    """2 slots and --cache-ram 8 (MiB): SmolLM2's KV takes 23,040 bytes a token (30 layers × 3 KV
    heads × 64 × K and V × f16; `loadgen kv`). llama-server's host cache holds a slot's whole saved
    state: 187 cells (184 prompt tokens, 120 shared + 64 of its own, and 3 of the 4 answer tokens) ×
    (23,040 + 12 bytes of cell metadata) + its header, about 4.1 MiB, so 8 MiB hold 1 entry; with idle
    slots saved (the default) the cache must hold every conversation but the one just served, so 2
    stay warm (the slots), collapse at K = 3 (docs/cache.md, from the server's source). The test asserts
    the prediction, that reuse collapses at the K after it and that the server's RSS was read at
    every K. Small, so that it ends on a loaded machine."""
    import json

    server = start_llama_server("smollm2-capacity", 2, tmp_path_factory.mktemp("llama-logs"),
                                extra=("--cache-ram", "8"))
    try:
        proc = subprocess.run([*LOADGEN, "cache-capacity", "--url", server.url, "--conversation-tokens", "120",
                               "--k", "1,2,3,4,5", "--rounds", "2", "--server-pid", str(server.proc.pid),
                               "--cache-ram-mib", "8", "--bytes-per-token", "23040",
                               "--output", str(tmp_path / "cap")],
                              capture_output=True, text=True, timeout=800)
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    print(proc.stdout)
    summary = json.loads((tmp_path / "cap" / "cache-capacity.json").read_text())
    assert summary["predicted_capacity"] == 2
    assert all(lv["rss_mib"] and lv["rss_mib"] > 0 for lv in summary["levels"])
    assert summary["levels"][0]["warm_hit_ratio"] > 0.5
    # Measured 2026-12-02 and 2026-12-04: 65.8% at K = 2, 0.4% at K = 3 (one request at a time: deterministic).
    assert summary["collapse_k"] == summary["predicted_capacity"] + 1
