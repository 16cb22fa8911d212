"""Drawn workloads on a real llama-server (issue 35): every request's prompt_n is its drawn length
(the salt, the BOS token and, with --api chat, the chat template are inside the count: no overhead
on top), its predicted_n its drawn answer length, and the drawn lengths follow the asked
distribution."""

from __future__ import annotations

import json
import subprocess

import pytest

from loadgen.core.workload import Workload, parse_length_spec
from loadgen.results.reader import load_records, load_run_dict
from loadgen.run.trace_replay import plan_replay, read_trace
from servers import LOADGEN, start_llama_server

stats = pytest.importorskip("scipy.stats")
pytestmark = pytest.mark.real

# Lengths small enough for a loaded test machine; the lowest above what --api chat's template and
# the salt take (49 tokens on SmolLM2).
PROMPTS, ANSWERS, SEED = "uniform:80:240", "normal:6,2,min=1,max=10", 11


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = start_llama_server("smollm2-workload", 2, tmp_path_factory.mktemp("llama-logs"))
    yield s
    s.stop()


@pytest.mark.timeout(900)
@pytest.mark.parametrize("api, requests", [("llamacpp", 24), ("chat", 6)])
def test_each_prompt_n_is_its_drawn_length_and_each_answer_its_drawn_n_predict(server, tmp_path, api, requests):
    out = tmp_path / api
    proc = subprocess.run([*LOADGEN, "sweep", "--url", server.url, "--api", api, "--concurrency", "2",
                           "--requests", str(requests), "--prompt-tokens", PROMPTS, "--n-predict", ANSWERS,
                           "--workload-seed", str(SEED), "--warmup", "1", "--output", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    shapes = Workload(parse_length_spec(PROMPTS), parse_length_spec(ANSWERS), seed=SEED).draw()
    records = load_records(out)
    assert len(records) == requests and all(r.ok for r in records)
    for r in records:
        shape = shapes[r.seq % len(shapes)]
        assert (r.prompt_tokens_target, r.n_predict_target) == (shape.prompt_tokens, shape.n_predict)
        assert r.prompt_n == shape.prompt_tokens, (r.seq, r.prompt_n, shape)
        assert r.predicted_n == shape.n_predict, (r.seq, r.predicted_n, shape)
    # The lengths sent are a sample of the asked distribution (integers 80..240, each equally likely).
    sent = [r.prompt_n for r in records]
    if api == "llamacpp":
        assert stats.kstest(sent, stats.uniform(79.5, 161).cdf).pvalue > 0.01
    level = load_run_dict(out)["targets"][0]["levels"][0]
    assert level["prompt_n"]["max"] == max(sent) and level["prompt_n"]["count"] == requests


@pytest.mark.timeout(900)
@pytest.mark.parametrize("api", ["llamacpp", "chat"])  # chat: the template's tokens inside the length, as sweep's
def test_a_mooncake_trace_replays_with_each_prompt_exact_and_reads_back(server, tmp_path, api):
    trace = tmp_path / "trace.jsonl"
    rows = [{"timestamp": 400 * i, "input_length": 3000 + 700 * i, "output_length": 100 + 50 * i,
             "hash_ids": list(range(i + 1))} for i in range(6)]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "replay"
    proc = subprocess.run([*LOADGEN, "replay", str(trace), "--url", server.url, "--scale-lengths", "0.03",
                           "--max-n-predict", "8", "--warmup", "1", "--api", api, "--output", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "send lag (actual send − trace time): p50" in proc.stderr
    plan = plan_replay(read_trace(str(trace)), scale_lengths=0.03, max_output=8, min_prompt=48)
    records = sorted(load_records(out), key=lambda r: r.seq)
    assert len(records) == 6 and all(r.ok for r in records)
    for r, shape in zip(records, plan.shapes):
        assert (r.prompt_n, r.predicted_n) == (shape.prompt_tokens, shape.n_predict)
    analyzed = subprocess.run([*LOADGEN, "analyze", str(out)], capture_output=True, text=True, timeout=120)
    assert analyzed.returncode == 0 and "replay of trace.jsonl" in analyzed.stdout


def test_replayed_prompts_share_exactly_the_trace_blocks_on_the_servers_tokenizer(server):
    import asyncio

    from loadgen.client.backends import GenerationParams, make_backend
    from loadgen.client.tokenize import server_tokenizer
    from loadgen.run.config import SweepConfig, Target
    from loadgen.run.state import TargetRun
    from loadgen.run.trace_prompts import trace_generation
    from loadgen.run.trace_replay import TraceRequest

    requests = [TraceRequest(0, 5000, 10, (1, 2, 3)), TraceRequest(1, 4000, 10, (1, 2, 9)),
                TraceRequest(2, 4000, 10, (7, 2, 3))]
    plan = plan_replay(requests, scale_lengths=0.04, min_prompt=48)  # blocks of 20 tokens

    class Messages:
        def message(self, text: str) -> None:
            pass

    config = SweepConfig(targets=(Target(server.url),), concurrency=(1,), generation=GenerationParams(prompt="p"),
                         replay=plan)
    generation, options = asyncio.run(trace_generation(config, TargetRun(config.targets[0], "s"), Messages(), plan))
    backend = make_backend("llamacpp", generation)
    prompts = [json.loads(backend.build(options.salt(), i))["prompt"] for i in range(3)]

    async def tokenized() -> list[tuple[list[bytes], int]]:
        async with server_tokenizer(server.url) as tok:
            return [(await tok.pieces(p), await tok.count(p)) for p in prompts]

    (a, na), (b, nb), (c, nc) = asyncio.run(tokenized())
    # Each block's text ends in its one newline: blocks 1 and 2 are the first two lines of both.
    two_blocks = "".join(line + "\n" for line in generation.prefixes[0].split("\n")[:2])
    assert generation.prefixes[1].startswith(two_blocks) and not generation.prefixes[1].startswith(
        generation.prefixes[0])  # block 9, not 3, third
    common = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    assert b"".join(a[:common]).decode().startswith(two_blocks)  # the two shared blocks, token for token
    assert not prompts[2].startswith(generation.prefixes[0][:20])  # block 7 first: nothing shared
    assert [na, nb, nc] == [s.prompt_tokens for s in plan.shapes]
