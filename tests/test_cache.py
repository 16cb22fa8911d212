"""Cache modes on the in-process simulator (its slots keep their prompt's tokens and reuse the
longest common prefix, as llama-server's do): exact hit counts for shared prefixes, the cache
figures' formulas on hand-made records, the cache table, and compare's refusal of cached against
uncached runs."""

from __future__ import annotations

import pytest
import uvloop

from loadgen.analysis.cache import (
    cache_figures,
    hit_ratio,
    is_hit,
    prefill_saved_ms,
    turn_figures,
)
from loadgen.analysis.compare import CompareError, check_comparable
from loadgen.client.backends import GenerationParams
from loadgen.core.cache_mode import SharedPrefix
from loadgen.core.records import RequestRecord
from loadgen.run.config import SweepConfig, Target
from loadgen.run.level_runner import LocalRunner
from loadgen.run.state import Run
from loadgen.run.sweep import run_sweep
from loadgen.sim import load_profile, start_simulator
from loadgen.sim.tokenizer import tokenize
from servers import SimThread

SMOKE = load_profile("smoke")


class Quiet:
    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def _shared_prefix_run(mode: SharedPrefix, slots: int, requests: int, cache_ram_tokens: int = 0) -> list[RequestRecord]:
    async def main() -> Run:
        async with await start_simulator(SMOKE, slots=slots, seed=3, cache_ram_tokens=cache_ram_tokens) as sim:
            config = SweepConfig(targets=(Target(sim.url, "smoke"),),
                                 generation=GenerationParams(prompt="hi", n_predict=4, seed=1, stream=True),
                                 concurrency=(1,), requests_per_level=requests, warmup=0, wait_ready_s=5,
                                 probe_interval_s=0, shared_prefix=mode)
            run = Run(config)
            await run_sweep(run, Quiet(), LocalRunner())
            return run
    run = uvloop.run(main())
    assert run.targets[0].error is None, run.targets[0].error
    return sorted(run.targets[0].levels[0].records, key=lambda r: r.seq)


# (groups, slots, cache on, requests) -> requests that reuse the prefix, written before running:
# one request at a time; a group's first request misses; a later one finds its group's prefix in a
# slot unless another group took that slot since (LRU over fewer slots than groups: each request
# evicts the group needed next, so 3 groups round-robin over 2 slots never hit). Cache off: none.
# With a host cache (--cache-ram) of room for every group, the slot a group lost is saved and
# restored when the group comes back: 3 groups over 2 slots hit from their second round on. A host
# cache smaller than one saved prompt (about 174 tokens: 170 + the answer) keeps nothing.
def _shared_lead(a: str, b: str) -> int:
    """How many leading tokens two salts have in common on the simulator's tokenizer."""
    n = 0
    for x, y in zip(tokenize(a), tokenize(b)):
        if x != y:
            break
        n += 1
    return n


SHARED_PREFIX_CASES = [
    (1, 2, True, 6, 0, 5),
    (2, 2, True, 8, 0, 6),
    (3, 2, True, 9, 0, 0),
    (3, 4, True, 9, 0, 6),
    (2, 2, False, 8, 0, 0),
    (3, 2, True, 9, 10_000, 6),
    (3, 2, True, 9, 100, 0),
]


@pytest.mark.parametrize("groups,slots,cache_prompt,requests,cache_ram,hits", SHARED_PREFIX_CASES)
def test_shared_prefix_hits_on_the_simulator(groups, slots, cache_prompt, requests, cache_ram, hits):
    prefix, total = 120, 170
    records = _shared_prefix_run(SharedPrefix(prefix, groups, total, cache_prompt), slots, requests, cache_ram)
    assert len(records) == requests and all(r.ok for r in records)
    # Each prompt is exactly `total` tokens on the server, reused or computed.
    assert [r.cache_n + r.prompt_n for r in records] == [total] * requests
    hit = [r for r in records if is_hit(r.cache_n, r.prompt_n)]
    assert len(hit) == hits
    # A hit reuses BOS + the prefix, and of the salt after it no more than the leading tokens it
    # shares by chance with an earlier request's salt (two random salts start with the same
    # three-digit token once in a thousand).
    for r in hit:
        lead = max(_shared_lead(r.salt, e.salt) for e in records if e.seq < r.seq)
        assert prefix + 1 <= r.cache_n <= prefix + 1 + lead, (r.cache_n, r.salt, lead)
    # A miss reuses at most BOS and the first words two groups' prose may start with.
    assert all(r.cache_n < 8 for r in records if r not in hit)
    figures = cache_figures(records)
    assert figures.hits == hits
    assert figures.hit_ratio == pytest.approx(sum(r.cache_n for r in records) / (requests * total))
    if not cache_prompt:
        assert {r.cache_n for r in records} == {0}


def test_each_level_and_each_run_starts_cold():
    """Written before the run: 2 groups over 4 slots, levels C = 1 and 2, twice on one simulator.
    Each level's prefixes are new to the server, so each level has exactly its groups' first
    requests as misses (at C = 2 the two groups' first requests go together, both cold), the rest hit."""
    async def main() -> list[list[RequestRecord]]:
        levels = []
        async with await start_simulator(SMOKE, slots=4, seed=3) as sim:
            for _ in range(2):
                config = SweepConfig(targets=(Target(sim.url, "smoke"),),
                                     generation=GenerationParams(prompt="hi", n_predict=4, seed=1, stream=True),
                                     concurrency=(1, 2), requests_per_level=8, warmup=0, wait_ready_s=5,
                                     probe_interval_s=0, shared_prefix=SharedPrefix(120, 2, 170, True))
                run = Run(config)
                await run_sweep(run, Quiet(), LocalRunner())
                assert run.targets[0].error is None, run.targets[0].error
                levels += [lv.records for lv in run.targets[0].levels]
        return levels
    levels = uvloop.run(main())
    assert len(levels) == 4
    for records in levels:
        assert all(r.ok and r.cache_n + r.prompt_n == 170 for r in records)
        misses = sorted(r.seq for r in records if not is_hit(r.cache_n, r.prompt_n))
        assert misses == [0, 1]


def _record(cache_n, prompt_n, prompt_ms=10.0, *, slot=0, ttft_ms=None, error=None) -> RequestRecord:
    return RequestRecord(target="t", level=1, worker=0, seq=0, salt="s", send_ns=0, complete_ns=50_000_000,
                         status=200 if error is None else 500, error_kind=error, cache_n=cache_n, prompt_n=prompt_n,
                         prompt_ms=prompt_ms, id_slot=slot,
                         first_token_ns=None if ttft_ms is None else int(ttft_ms * 1e6))


# (cache_n, prompt_n) -> hit? (half the prompt or more reused; no counts: unknown)
HIT_CASES = [((0, 100), False), ((1, 99), False), ((50, 50), True), ((49, 51), False), ((200, 1), True),
             ((None, 100), None), ((0, 1), False)]


@pytest.mark.parametrize("counts,expected", HIT_CASES)
def test_what_counts_as_a_hit(counts, expected):
    assert is_hit(*counts) is expected


def test_the_figures_formulas_on_records_worked_by_hand():
    records = [_record(0, 100, 50.0), _record(90, 10, 5.0), _record(90, 10, 5.0), _record(None, None),
               _record(90, 10, error="http_error")]
    f = cache_figures(records)
    # Σcache 180, Σcomputed 120 (the failed and untimed requests left out): 180 / 300; prefill at
    # 60 ms per 120 computed tokens = 0.5 ms a token, 180 reused tokens saved 90 ms.
    assert (f.requests, f.hits, f.cache_n_total, f.prompt_n_total) == (3, 2, 180, 120)
    assert f.hit_ratio == pytest.approx(0.6)
    assert f.prefill_saved_ms == pytest.approx(90.0)
    assert hit_ratio(0, 0) is None and prefill_saved_ms(10, None) is None


def test_turn_figures_keep_each_turn_apart():
    turns = [(1, _record(0, 100, slot=0, ttft_ms=40)), (1, _record(0, 120, slot=1, ttft_ms=60)),
             (2, _record(150, 30, slot=0, ttft_ms=10)), (2, _record(170, 30, slot=1, ttft_ms=12))]
    first, second = turn_figures(turns)
    assert (first.turn, first.requests, first.prompt_tokens_p50, first.cache_n_p50, first.hit_ratio) == \
        (1, 2, 110, 0, 0.0)
    assert (second.prompt_tokens_p50, second.cache_n_p50, second.ttft_ms_p50, second.slots) == (190, 160, 11, (0, 1))
    assert second.hit_ratio == pytest.approx(320 / 380)


def _doc(config: dict) -> dict:
    return {"kind": "sweep", "config": {"api": "llamacpp", "mode": "concurrency", **config}, "complete": True,
            "targets": []}


def test_compare_refuses_a_cached_run_against_an_uncached_one_in_one_line():
    cached = _doc({"cache_prompt": True, "cache": SharedPrefix(100, 2).to_dict()})
    with pytest.raises(CompareError) as caught:
        check_comparable(_doc({"cache_prompt": False}), cached)
    assert "cache" in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(CompareError):
        check_comparable(cached, _doc({"cache_prompt": False}))


def test_compare_says_two_cache_modes_in_words():
    from loadgen.core.cache_mode import MultiTurn
    prefix = _doc({"cache_prompt": True, "cache": SharedPrefix(100, 2).to_dict()})
    chat = _doc({"cache_prompt": True, "cache": MultiTurn(4, 5).to_dict()})
    with pytest.raises(CompareError) as caught:
        check_comparable(prefix, chat)
    assert str(caught.value) == (
        "the runs are not comparable: their cache modes differ (baseline: shared prefix (2 group(s) sharing a 100-token "
        "prefix, prompts of 164 tokens); candidate: multi-turn chat (4 users × 5 turns)); rerun the candidate with "
        "the baseline's settings")


def _level(k, ratio):
    from loadgen.analysis.cache import CapacityLevel
    if ratio == "failed":  # no warm request succeeded
        return CapacityLevel(k, 0, None, None)
    return CapacityLevel(k, 2 * k, ratio, None)


# (warm hit ratio per K) -> the K where reuse collapsed (below half the best of the smaller Ks).
COLLAPSE_CASES = [
    ({1: 0.9, 2: 0.9, 4: 0.9, 8: 0.0}, 8),
    ({1: 0.9, 2: 0.9, 3: 0.44, 4: 0.0}, 3),
    ({1: 0.9, 2: 0.5, 3: 0.46}, None),
    ({1: 0.0, 2: 0.0}, None),
    ({1: None, 2: 0.8, 3: 0.1}, 3),
    ({}, None),
    ({1: 0.9, 2: "failed", 3: 0.8}, None),  # a K where nothing succeeded tells nothing
    ({1: 0.9, 2: "failed", 3: 0.1}, 3),
]


@pytest.mark.parametrize("ratios,expected", COLLAPSE_CASES)
def test_where_reuse_collapses(ratios, expected):
    from loadgen.analysis.cache import collapse_k
    assert collapse_k([_level(k, r) for k, r in ratios.items()]) == expected


# (slots, slot ctx, prompt tokens, answer tokens, cache_ram MiB, bytes per token[, cache_idle_slots,
# kv_unified, shared tokens]) -> conversations predicted warm. Worked by hand before the code: an entry is the slot's
# cells (prompt + answer - 1) x (bytes per token + 12) + 2,048; the host cache holds C = floor(limit /
# entry) of them; warm = max(slots, C + 1) with idle slots saved (the default), slots + C - 1 without,
# C + 1 on a unified KV cache; the slots alone when C = 0.
PREDICTION_CASES = [
    ((4, 1024, 500, 4, None, None), 4),
    ((4, 1024, 500, 4, 0, 1000.0), 4),
    ((4, 400, 500, 4, None, None), 0),  # a conversation fits no slot
    ((2, None, 512, 4, 1, None), None),  # host cache on, its share unknown
    ((2, 1024, 512, 1, 1, 1024.0), 2),  # 532,480-byte entries: 1 fits in 1 MiB (the KV alone said 2)
    ((2, 2048, 264, 4, 16, 23040.0), 3),  # the test bed, 2026-12-02: 6,156,932-byte entries, C = 2
    ((2, 2048, 184, 4, 8, 23040.0), 2),  # the real test: 4,312,772-byte entries, C = 1
    ((2, 2048, 500, 4, 8, 23040.0), 2),  # an 11.1 MiB entry is over the 8 MiB limit: never saved
    ((4, 1024, 264, 4, 32, 23040.0), 6),  # C = 5; the 4 slots' copies count among them
    ((4, 1024, 264, 4, 32, 23040.0, False), 8),  # --no-cache-idle-slots: 4 slots + 5 - 1
    ((4, 1024, 264, 4, 16, 23040.0), 4),  # C = 2: the slots decide
    ((4, 1024, 264, 4, 16, 23040.0, True, True), 3),  # unified KV: idle slots cleared, C + 1
    ((4, 1024, 500, 4, 8, 23040.0, True, True), 1),  # ... saved or not: only the slot just used
    ((1, 4096, 264, 4, 32, 23040.0), 5),  # 1 slot: it + C - 1
    ((1, 4096, 500, 4, 8, 23040.0), 1),
    ((2, 2048, 80, 4, 16, 23040.0), 9),  # 83-cell entries: 8 fit
    ((2, 2048, 80, 4, 16, 23040.0, True, False, 17), 2),  # ... but 17 shared < a quarter of 83: never restored
    ((2, 2048, 86, 4, 16, 23040.0, True, False, 23), 9),  # 23 of 89 is a quarter: restored
]


@pytest.mark.parametrize("args,expected", PREDICTION_CASES)
def test_the_predicted_capacity(args, expected):
    from loadgen.analysis.cache import predicted_capacity
    assert predicted_capacity(*args) == expected


# (cells, bytes per token) -> a host-cache entry's bytes; (cache_ram MiB, entry bytes) -> entries held.
ENTRY_CASES = [((267, 23040.0), 6_156_932), ((512, 1024.0), 532_480), ((1, 0.5), 2_061)]
HELD_CASES = [((16, 6_156_932), 2), ((8, 4_312_772), 1), ((8, 11_597_204), 0), ((1, 2**20), 1), ((0, 10), 0)]


@pytest.mark.parametrize("args,expected", ENTRY_CASES)
def test_a_host_cache_entry_holds_the_slot_state(args, expected):
    from loadgen.analysis.cache import prompt_cache_entry_bytes
    assert prompt_cache_entry_bytes(*args) == expected


@pytest.mark.parametrize("args,expected", HELD_CASES)
def test_entries_the_host_cache_holds(args, expected):
    from loadgen.analysis.cache import prompt_cache_entries
    assert prompt_cache_entries(*args) == expected


def test_capacity_on_the_simulator_collapses_past_its_slots_and_host_cache():
    """Written before the run: 2 slots and a host cache of 400 tokens (two saved conversations of
    about 174 tokens each). K ≤ 2 conversations live in the slots, so every warm request hits
    (BOS + the 120-token prefix of 170); K = 6 round-robin evicts, in slots and host cache alike,
    the conversation needed next, so none hits."""
    from loadgen.analysis.cache import capacity_level
    figures = {}
    for k in (1, 2, 6):
        records = _shared_prefix_run(SharedPrefix(120, k, 170, True), 2, 3 * k, cache_ram_tokens=400)
        figures[k] = capacity_level(k, records)
    assert figures[1].warm_requests == 2 and figures[6].warm_requests == 12
    assert figures[1].warm_hit_ratio == pytest.approx(121 / 170)
    assert figures[2].warm_hit_ratio == pytest.approx(121 / 170)
    assert figures[6].warm_hit_ratio < 0.05


# (slots, host cache tokens, K) -> whether every warm round-robin request hits, written before the
# run from the rule of docs/cache.md: an entry is 173 tokens (170 + 3 of the 4 answer tokens), so
# 400 tokens hold C = 2 and 600 hold 3; with idle slots saved max(slots, C + 1) stay warm (without
# that saving 4 slots and C = 2 would keep 5).
HOST_RULE_CASES = [
    (2, 400, 3, True), (2, 400, 4, False), (4, 400, 4, True), (4, 400, 5, False),
    (2, 600, 4, True), (2, 600, 5, False),
]


@pytest.mark.parametrize("slots,cache_ram_tokens,k,warm", HOST_RULE_CASES)
def test_the_simulators_host_cache_keeps_what_the_rule_predicts(slots, cache_ram_tokens, k, warm):
    from loadgen.analysis.cache import capacity_level, warm_conversations
    assert (k <= warm_conversations(slots, cache_ram_tokens // 173)) == warm
    records = _shared_prefix_run(SharedPrefix(120, k, 170, True), slots, 3 * k, cache_ram_tokens=cache_ram_tokens)
    ratio = capacity_level(k, records).warm_hit_ratio
    assert ratio == pytest.approx(121 / 170) if warm else ratio < 0.05


# ---------------------------------------------------------------- through the CLI, on a simulator

def test_a_prompt_longer_than_a_slots_context_is_refused_before_any_request(loadgen, tmp_path):
    with SimThread(slots=2) as sim:  # smoke: 2,048 tokens per slot
        for args in (("prefix", "--prefix-tokens", "3000"), ("cache-capacity", "--conversation-tokens", "3000")):
            code, _, err = loadgen(*args, "--url", sim.url, "--output", tmp_path / args[0])
            assert code == 2, err
            assert "3064 tokens" in err and "n_ctx 2,048" in err and len([ln for ln in err.splitlines() if "error" in ln]) == 1


def test_a_level_where_every_request_failed_shows_na_and_exits_1(loadgen, tmp_path):
    with SimThread(slots=2, faults=["http_500:1.0"]) as sim:
        code, out, err = loadgen("prefix", "--prefix-tokens", "100", "--url", sim.url, "--requests", "4",
                                 "--output", tmp_path / "p")
    assert code == 1, err
    assert "no request succeeded" in err
    cache = out[out.index("prompt cache"):].splitlines()
    row = [cell for cell in next(line for line in cache if "smoke" in line).split() if cell != "│"]
    assert row[2:5] == ["n/a", "n/a", "n/a"]  # hit ratio, cache_n, prompt_n: nothing known, not 0


def test_cache_capacity_stopped_during_a_k_keeps_the_finished_ks(loadgen, tmp_path, monkeypatch):
    import json

    from loadgen.cli import sweep  # cache-capacity runs each K with it, read at the call
    real, calls = sweep.execute_sweep, []

    def interrupted_at_the_second_k(config, out_dir, *args, **kwargs):
        calls.append(out_dir.name)
        return real(config, out_dir, *args, **kwargs) if len(calls) == 1 else 130  # as Ctrl-C during a run

    monkeypatch.setattr(sweep, "execute_sweep", interrupted_at_the_second_k)
    with SimThread(slots=2) as sim:
        code, out, err = loadgen("cache-capacity", "--url", sim.url, "--conversation-tokens", "100", "--k", "1,2,4",
                                 "--rounds", "2", "--output", tmp_path / "cc")
    assert code == 130, err
    assert calls == ["k-1", "k-2"]
    summary = json.loads((tmp_path / "cc" / "cache-capacity.json").read_text())
    assert summary["complete"] is False and [lv["k"] for lv in summary["levels"]] == [1]
    assert json.loads((tmp_path / "cc" / "k-1" / "run.json").read_text())["kind"] == "cache-capacity"
    assert "incomplete" in out and "stopped during K = 2" in err


# (cache_ram_mib given) -> what the prediction says it counted
PREDICTION_BASIS_CASES = [(None, "slots only: no --cache-ram-mib given"), (0.0, "slots only: --cache-ram-mib 0"),
                          (16.0, "the slots and the saved slot states --cache-ram holds")]


@pytest.mark.parametrize("cache_ram_mib,basis", PREDICTION_BASIS_CASES)
def test_the_prediction_says_what_it_counted(cache_ram_mib, basis):
    from loadgen.analysis.cache import CapacitySummary
    from loadgen.output.cache import cache_capacity_table
    summary = CapacitySummary(164, 2, 2, cache_ram_mib, 23040.0, True, False, 2, None, [_level(1, 0.7)])
    assert f"predicted: 2 conversations stay warm ({basis}), so collapse at K = 3" in \
        cache_capacity_table(summary).footnotes


def test_cache_capacity_refuses_a_server_pid_of_no_process(loadgen, tmp_path):
    code, _, err = loadgen("cache-capacity", "--url", "http://127.0.0.1:9", "--server-pid", "4194305",
                           "--output", tmp_path / "cc")
    assert code == 2 and "--server-pid 4194305: no such process" in err
    assert not (tmp_path / "cc").exists()


def test_a_prompt_too_short_for_the_salt_after_the_prefix_is_refused_naming_the_value_that_fits(loadgen, tmp_path):
    import re
    with SimThread(slots=2) as sim:
        code, _, err = loadgen("prefix", "--prefix-tokens", "100", "--prompt-tokens", "102", "--url", sim.url,
                               "--output", tmp_path / "short")
        assert code == 2, err
        least = int(re.search(r"give --prompt-tokens (\d+) or more", err).group(1))
        assert "--prompt-tokens 102 leaves 2 tokens after the 100-token prefix" in err
        code, _, err = loadgen("prefix", "--prefix-tokens", "100", "--prompt-tokens", least - 1, "--url", sim.url,
                               "--output", tmp_path / "one-less")
        assert code == 2 and f"give --prompt-tokens {least} or more" in err
        code, _, err = loadgen("prefix", "--prefix-tokens", "100", "--prompt-tokens", least, "--url", sim.url,
                               "--requests", "2", "--output", tmp_path / "enough")
        assert code == 0, err


def test_cache_runs_say_their_command_sort_ks_and_export_their_cache_columns(loadgen, tmp_path):
    import csv
    with SimThread(slots=2) as sim:
        code, out, err = loadgen("prefix", "--prefix-tokens", "100", "--groups", "2", "--requests", "4", "--url",
                                 sim.url, "--output", tmp_path / "p")
        assert code == 0, err
        assert "loadgen prefix" in out and "loadgen sweep" not in out
        code, out, err = loadgen("cache-capacity", "--url", sim.url, "--conversation-tokens", "100", "--k", "2,1",
                                 "--rounds", "2", "--output", tmp_path / "cc")
        assert code == 0, err
    table = out[out.index("prompt-cache capacity"):]
    ks = [line.split("│")[1].strip() for line in table.splitlines() if line.startswith("│")]
    assert ks == ["1", "2"]
    code, out, err = loadgen("analyze", tmp_path / "cc")  # its per-K table again, from cache-capacity.json
    assert code == 0 and out.count("prompt-cache capacity") == 1, err
    # the report: each K's run, in K order, the first with the per-K table and where reuse collapsed
    code, md, err = loadgen("report", tmp_path / "cc", "--format", "markdown")
    assert code == 0, err
    assert [line.split(":")[0] for line in md.splitlines() if line.startswith("## ")] == ["## cc K=1", "## cc K=2"]
    assert md.count("### prompt-cache capacity") == 1 and "- reuse " in md.split("## cc K=2")[0], md
    code, _, err = loadgen("export", tmp_path / "cc", "--format", "csv", "--output", tmp_path / "cc-csv")
    assert code == 2 and "cache-capacity" in err and "k-1, k-2" in err
    assert loadgen("export", tmp_path / "p", "--format", "csv", "--output", tmp_path / "csv")[0] == 0
    with (tmp_path / "csv" / "levels.csv").open(newline="") as f:
        row = next(csv.DictReader(f))
    # 4 requests over 2 groups, one at a time: each group's second request reuses BOS + the prefix.
    assert float(row["cache_hit_ratio"]) == pytest.approx(2 * 101 / (4 * 164))
    assert float(row["cache_n_p50"]) > 0 and row["ttft_cache_miss_ms_p50"] and row["prefill_saved_ms"]
