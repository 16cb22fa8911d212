"""`loadgen replay TRACE` (issue 35): traces read in both formats, the schedule and lengths they
give (speed, scaling, clamps, limit), and a replay on the simulator that sends each request at its
trace time with its lengths and reads back through analyze and export."""

from __future__ import annotations

import json

import pytest

from loadgen.core.errors import ConfigError
from loadgen.results.reader import load_records, load_run_dict
from loadgen.run.trace_replay import TraceRequest, plan_replay, read_trace
from servers import SimThread

MOONCAKE = [
    {"timestamp": 1000, "input_length": 6000, "output_length": 300, "hash_ids": [0, 1, 2]},
    {"timestamp": 1000, "input_length": 2000, "output_length": 20, "hash_ids": [0, 7]},
    {"timestamp": 1500, "input_length": 800, "output_length": 5, "hash_ids": [9]},
    {"timestamp": 1250, "input_length": 100, "output_length": 1000, "hash_ids": []},
]


def _mooncake(path):
    path.write_text("".join(json.dumps(row) + "\n" for row in MOONCAKE))
    return path


def test_both_formats_read_to_the_same_requests(tmp_path):
    assert read_trace(str(_mooncake(tmp_path / "t.jsonl")))[0] == TraceRequest(1000, 6000, 300, (0, 1, 2))
    csv = tmp_path / "t.csv"
    csv.write_text("time,input,output\n1.0,6000,300\n1.25,100,1000\n")
    assert read_trace(str(csv)) == [TraceRequest(1000, 6000, 300), TraceRequest(1250, 100, 1000)]
    plain = tmp_path / "p.jsonl"
    plain.write_text('{"time": 2, "input": 10, "output": 3}\n')
    assert read_trace(str(plain)) == [TraceRequest(2000, 10, 3)]


@pytest.mark.parametrize("line, phrase", [
    ('{"timestamp": 1, "input_length": "many", "output_length": 1}', "not a number"),
    ('{"timestamp": -1, "input_length": 1, "output_length": 1}', "not a non-negative number"),
    ('{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": ["a"]}', "hash_ids"),
    ('{"when": 1}', "neither a Mooncake line"),
    ("[1, 2]", "not a JSON object"),
    ("{", "not a JSON line"),
])
def test_a_bad_trace_line_is_named(tmp_path, line, phrase):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"time": 0, "input": 1, "output": 1}\n' + line + "\n")
    with pytest.raises(ConfigError) as info:
        read_trace(str(path))
    assert phrase in str(info.value) and f"{path}:2" in str(info.value)


def test_the_plan_orders_by_time_scales_clamps_and_limits():
    requests = [TraceRequest(r["timestamp"], r["input_length"], r["output_length"], tuple(r["hash_ids"]))
                for r in MOONCAKE]
    # Expected, worked out by hand: time order 1000, 1000, 1250, 1500 (ties in file order); at
    # speed 2 the offsets halve; lengths ×0.05 rounded, prompts clamped to [48, 200], answers to [1, 16].
    plan = plan_replay(requests, speed=2.0, scale_lengths=0.05, max_prompt=200, max_output=16, min_prompt=48)
    assert plan.offsets_ns == (0, 0, 125_000_000, 250_000_000)
    assert [(s.prompt_tokens, s.n_predict) for s in plan.shapes] == [(200, 15), (100, 1), (48, 16), (48, 1)]
    assert [s.prefix_id for s in plan.shapes] == [0, 0, None, 9]
    assert plan.rate == pytest.approx(3 / 0.25)
    assert plan_replay(requests, limit=2).offsets_ns == (0, 0)
    assert plan_replay(requests, limit=2).rate == 1.0  # both at one time: no span to divide by
    with pytest.raises(ConfigError):
        plan_replay(requests, speed=0)


def test_a_replay_sends_each_request_at_its_trace_time_with_its_lengths(loadgen, tmp_path):
    trace = _mooncake(tmp_path / "t.jsonl")
    out = tmp_path / "run"
    with SimThread() as sim:
        code, stdout, err = loadgen("replay", trace, "--url", sim.url, "--scale-lengths", "0.05",
                                    "--max-prompt-tokens", "200", "--max-n-predict", "16", "--warmup", "0",
                                    "--output", out)
    assert code == 0, err
    assert "send lag (actual send − trace time)" in err
    records = sorted(load_records(out), key=lambda r: r.seq)
    plan = plan_replay(read_trace(str(trace)), scale_lengths=0.05, max_prompt=200, max_output=16)
    # Lengths (time order) 200 (clamped), 100, 5 and 40: the 40 is sent as 40 (the UUID salt floored it at 48);
    # the 5 cannot hold the salt, so it is raised to the shortest prompt that can, and said so.
    assert [s.prompt_tokens for s in plan.shapes] == [200, 100, 5, 40]
    doc = load_run_dict(out)
    assert doc["kind"] == "replay"  # the command, not "sweep" (schema 4)
    changed = doc["targets"][0]["lengths_changed"]
    floor = changed["floor_tokens"]
    assert changed == {"floored": 1, "requests": 4, "floor_tokens": floor} and 5 < floor < 20
    for r, shape, offset in zip(records, plan.shapes, plan.offsets_ns):
        assert (r.prompt_n, r.predicted_n) == (max(floor, shape.prompt_tokens), shape.n_predict)
        assert r.prompt_tokens_target == shape.prompt_tokens  # the length asked for, kept
        assert r.intended_ns - records[0].intended_ns == offset  # each request due at its trace time
    assert f"1 of 4 prompts floored to {floor} tokens" in stdout
    assert doc["config"]["mode"] == "rate" and doc["config"]["workload"]["replay"]["trace"] == "t.jsonl"
    level = doc["targets"][0]["levels"][0]
    assert level["requests_ok"] == 4 and level["schedule_lag_ms"] is not None
    code, text, err = loadgen("analyze", out)
    assert code == 0 and "workload: tokens per request (asked: replay of t.jsonl" in text, err
    code, _, err = loadgen("export", out, "--format", "csv", "--out", tmp_path / "csv")
    assert code == 0, err
    # Exported as a trace, the run replays as it ran: the same times, the lengths it asked for.
    code, _, err = loadgen("export", out, "--format", "trace", "--out", tmp_path / "trace")
    assert code == 0, err
    (exported,) = (tmp_path / "trace").glob("trace-*.jsonl")
    again = plan_replay(read_trace(str(exported)))
    assert again.offsets_ns == plan.offsets_ns
    assert [(s.prompt_tokens, s.n_predict) for s in again.shapes] == [(s.prompt_tokens, s.n_predict)
                                                                       for s in plan.shapes]


def test_a_replay_is_judged_against_latency_targets(loadgen, tmp_path):
    # --slo on a replay (it took none): each request judged as a sweep's; an e2e target no request can
    # meet (1 µs) and one every request meets (1 min) give attainments 0 and 1.
    trace = _mooncake(tmp_path / "t.jsonl")
    with SimThread() as sim:
        for name, slo, attained in (("never", "e2e=1us", 0.0), ("always", "e2e=1m", 1.0)):
            code, _, err = loadgen("replay", trace, "--url", sim.url, "--scale-lengths", "0.05", "--max-prompt-tokens",
                                   "200", "--max-n-predict", "16", "--warmup", "0", "--slo", slo,
                                   "--output", tmp_path / name)
            assert code == 0, err
            judged = load_run_dict(tmp_path / name)["targets"][0]["levels"][0]["slo"]
            assert judged["judged"] == 4 and judged["attainment"] == attained, judged
    code, _, err = loadgen("replay", trace, "--url", "http://127.0.0.1:9", "--slo", "ttft=1s", "--output",
                           tmp_path / "nostream")
    assert code == 2 and "add --stream" in err


def test_replay_takes_one_target(loadgen, tmp_path):
    code, _, err = loadgen("replay", _mooncake(tmp_path / "t.jsonl"), "--ports", "9,10", "--output", tmp_path / "r")
    assert code == 2 and "one target at a time" in err


class _Messages:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def message(self, text: str) -> None:
        self.lines.append(text)


def test_requests_that_share_blocks_share_that_prefix_on_the_wire_salt_after():
    import asyncio

    from loadgen.client.backends import GenerationParams, make_backend
    from loadgen.client.tokenize import server_tokenizer
    from loadgen.run.config import SweepConfig, Target
    from loadgen.run.state import TargetRun
    from loadgen.run.trace_prompts import trace_generation

    requests = [TraceRequest(0, 4000, 100, (1, 2, 3)), TraceRequest(10, 3000, 100, (1, 2)),
                TraceRequest(20, 3000, 100, (5, 2)), TraceRequest(30, 900, 100, ())]
    plan = plan_replay(requests, scale_lengths=0.05, min_prompt=48)  # blocks of 26 tokens
    with SimThread() as sim:
        config = SweepConfig(targets=(Target(sim.url),), concurrency=(1,), generation=GenerationParams(prompt="p"),
                             replay=plan)
        t = TargetRun(config.targets[0], "sim")
        generation, options = asyncio.run(trace_generation(config, t, _Messages(), plan))
        backend = make_backend("llamacpp", generation)
        prompts = [json.loads(backend.build(options.salt(), i))["prompt"] for i in range(4)]

        async def tokens(text: str) -> tuple[list[bytes], int]:
            async with server_tokenizer(sim.url) as tok:
                return await tok.pieces(text), await tok.count(text)  # count: as the server counts a prompt

        measured = [asyncio.run(tokens(p)) for p in prompts]
        pieces, counts = [m[0] for m in measured], [m[1] for m in measured]

    a, b, c, d = prompts
    shared = generation.prefixes[1]  # blocks 1 and 2
    assert shared and a.startswith(shared) and b.startswith(shared + "[")
    assert not c.startswith(generation.prefixes[0][:10])  # block 5 first: another text
    assert d.startswith("[")  # no blocks: salted at the start, as in a sweep
    # The shared blocks are the same tokens in both requests, and each prompt is exactly its length.
    n = len(shared.encode())
    assert b"".join(pieces[0])[:n] == b"".join(pieces[1])[:n] == shared.encode()
    assert counts == [s.prompt_tokens for s in plan.shapes]


def test_a_short_prompt_of_a_trace_without_blocks_keeps_its_length_and_a_too_short_one_is_named(loadgen, tmp_path):
    # A 20-token prompt is sent as 20 tokens (the UUID salt floored every prompt at 48); one of 3
    # tokens cannot hold the salt: raised to the shortest that can, counted and named.
    trace = tmp_path / "t.csv"
    trace.write_text("time,input,output\n0,20,4\n0.05,3,4\n")
    out = tmp_path / "run"
    with SimThread() as sim:
        code, stdout, err = loadgen("replay", trace, "--url", sim.url, "--warmup", "0", "--output", out)
    assert code == 0, err
    twenty, three = sorted(load_records(out), key=lambda r: r.seq)
    assert (twenty.prompt_n, twenty.prompt_tokens_target) == (20, 20)
    changed = load_run_dict(out)["targets"][0]["lengths_changed"]
    assert changed["floored"] == 1 and changed["requests"] == 2
    assert (three.prompt_n, three.prompt_tokens_target) == (changed["floor_tokens"], 3)
    assert f"1 of 2 prompts floored to {changed['floor_tokens']} tokens" in stdout
