"""On the test bed's llama-server with a 256-token context (issue 46 items 7 and 9): the default
prompt that leaves no room for its answer is refused up front, and answers the context cut are
counted per level (`answers_cut`) and named in the table note; the salt's token count on SmolLM2."""

from __future__ import annotations

import json
import subprocess

import pytest

from loadgen.results.reader import load_records, load_run_dict
from servers import LOADGEN, start_llama_server

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = start_llama_server("smollm2-ctx256", 1, tmp_path_factory.mktemp("llama-logs"), extra=("-c", "256"))
    yield s
    s.stop()


def _loadgen(*args) -> subprocess.CompletedProcess:
    return subprocess.run([*LOADGEN, *map(str, args)], capture_output=True, text=True, timeout=300)


def test_the_salt_is_eighteen_tokens_on_smollm2(server):
    import asyncio

    from loadgen.client.tokenize import server_tokenizer
    from loadgen.run.exact_prompt import salted
    from loadgen.run.salts import new_salt

    async def counts() -> set[int]:
        async with server_tokenizer(server.url) as tok:
            return {await tok.count(salted(new_salt(), "x")) - await tok.count("x") for _ in range(20)}

    assert asyncio.run(counts()) == {18}  # "[" + 16 digits + "]"; the UUID salt was 31 to 39


def test_the_default_prompt_with_too_long_an_answer_is_refused_up_front(server, tmp_path):
    # Before: "2 ok" with 212 and 210 tokens of the 400 asked, stop_type limit, and no note.
    proc = _loadgen("sweep", "--url", server.url, "--concurrency", "1", "--requests", "2", "--n-predict", "400",
                    "--warmup", "0", "--output", tmp_path / "r")
    assert proc.returncode == 2, proc.stderr
    assert "cannot take the prompt" in proc.stderr and "n_predict 400 > per-slot n_ctx 256" in proc.stderr


def test_answers_cut_by_the_context_are_counted_and_named(server, tmp_path):
    # A short prompt (~21 tokens + 150 fits in 256) and a long one (~170 tokens: its answer is cut).
    data = tmp_path / "d.jsonl"
    long = " ".join(["The quick brown fox jumps over the lazy dog."] * 15)
    data.write_text(json.dumps({"prompt": "Say hi."}) + "\n" + json.dumps({"prompt": long}) + "\n")
    out = tmp_path / "r"
    proc = _loadgen("sweep", "--url", server.url, "--concurrency", "1", "--requests", "4", "--n-predict", "150",
                    "--dataset", data, "--warmup", "0", "--output", out)
    assert proc.returncode == 0, proc.stderr
    assert "leave no room for n_predict 150" in proc.stderr
    records = load_records(out)
    cut = [r for r in records if r.output_tokens < 150]
    assert len(cut) == 2 and all(r.stop_type == "limit" and r.prompt_n + r.output_tokens >= 250 for r in cut)
    level = load_run_dict(out)["targets"][0]["levels"][0]
    assert level["answers_cut"] == 2 and "answers_short" not in level
    assert "2 answers cut by the context (2 at c=1)" in proc.stdout
