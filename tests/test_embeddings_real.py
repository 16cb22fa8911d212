"""On the test bed's llama-server (build 11434, SmolLM2-135M): `--api embeddings` and `--api rerank`
sweeps (issue 50), their correctness check under load, and their prompt tokens against the server's
own counter (`llamacpp:prompt_tokens_total` counts embedding and rerank tokens, and no prompt cache
serves them: the same text sent twice is counted twice).

What the test bed showed (docs/request-features.md): with `--pooling last` every vector is the same
alone and under load; with `--pooling mean` (and `cls`, and `rank` for rerank) a text answered in
one batch with other texts of other lengths (several inputs of one request, or requests that
overlap in the server's slots) gets another vector than alone: cosine 0.69 to 0.98 for the check's
texts. The check reports it, naming the input; these tests hold both.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from loadgen.analysis.embedding_check import CHECK_TEXTS
from servers import LOADGEN, start_llama_server

pytestmark = pytest.mark.real


def _server(tmp_path_factory, alias, slots, *flags):
    return start_llama_server(alias, slots, tmp_path_factory.mktemp("llama-logs"), extra=flags)


@pytest.fixture(scope="module")
def last_pooling(tmp_path_factory):
    s = _server(tmp_path_factory, "smollm2-embed-last", 4, "--embeddings", "--pooling", "last")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def mean_pooling(tmp_path_factory):
    s = _server(tmp_path_factory, "smollm2-embed-mean", 4, "--embeddings", "--pooling", "mean")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    s = _server(tmp_path_factory, "smollm2-rerank", 2, "--reranking", "--pooling", "rank")
    yield s
    s.stop()


def _sweep(url, tmp_path, *args):
    out = tmp_path / "run"
    proc = subprocess.run([*LOADGEN, "sweep", "--url", url, *map(str, args), "--output", str(out)],
                          capture_output=True, text=True, timeout=600)
    levels = json.loads((out / "run.json").read_text())["targets"][0]["levels"] if (out / "run.json").exists() else []
    return proc, levels, out


def _mismatches(out, kind):
    lines = (out / "requests.jsonl").read_text().splitlines()
    return [r["error_message"] for r in map(json.loads, lines) if r.get("error_kind") == kind]


def test_embeddings_at_concurrency_1_and_8_pass_the_check(last_pooling, tmp_path):
    proc, levels, _ = _sweep(last_pooling.url, tmp_path, "--api", "embeddings", "--items", "2",
                             "--concurrency", "1,8", "--requests", "32")
    assert proc.returncode == 0, proc.stderr
    assert [lv["level"] for lv in levels] == [1, 8]
    for lv in levels:
        assert lv["requests_ok"] == 32 and lv["errors_by_kind"] == {}, lv  # 8 check requests each, all equal
        assert lv["texts"] == 64 and lv["texts_per_s"] > 0 and lv["input_tok_s"] > 0
        assert lv["output_tokens"] == 0 and "answers_short" not in lv
        # Σ usage.prompt_tokens of the level = the server's own count of the tokens it computed
        assert lv["input_tokens"] == lv["server_metrics_delta"]["llamacpp:prompt_tokens_total"]
    assert "texts/s" in proc.stdout


def test_mean_pooling_gives_other_vectors_to_texts_batched_together(mean_pooling, tmp_path):
    """Four texts in one request, sent one request at a time: each check text's vector differs from
    its vector alone (build 11434), and the failure names the input."""
    proc, levels, out = _sweep(mean_pooling.url, tmp_path, "--api", "embeddings", "--items", "4",
                               "--concurrency", "1", "--requests", "8", "--warmup", "0")
    assert levels and levels[0]["errors_by_kind"] == {"embedding_mismatch": 2}, (levels, proc.stderr)
    messages = _mismatches(out, "embedding_mismatch")
    assert messages[0].startswith(f"input 0 ('{CHECK_TEXTS[0][:40]}…'): cosine 0.6"), messages
    assert "at concurrency 1: embedding_mismatch ×2" in proc.stderr


def test_a_server_without_embeddings_or_reranking_is_refused_before_the_first_level(tmp_path):
    """Its 501 named in one line, exit 1, no level run."""
    logs = tmp_path / "logs"
    logs.mkdir()
    plain = start_llama_server("smollm2-plain", 1, logs)
    try:
        for api, flag in (("embeddings", "--embeddings"), ("rerank", "--reranking")):
            proc, levels, _ = _sweep(plain.url, tmp_path / api, "--api", api, "--concurrency", "1", "--requests", "2")
            assert proc.returncode == 1, proc.stderr
            said = [ln for ln in proc.stderr.splitlines() if "answered http_501" in ln]
            assert len(said) == 1 and f"Start it with `{flag}`" in said[0], proc.stderr
            assert levels == []
    finally:
        plain.stop()


def test_rerank_one_document_a_request_passes_the_check(reranker, tmp_path):
    proc, levels, _ = _sweep(reranker.url, tmp_path, "--api", "rerank", "--concurrency", "1", "--requests", "16")
    assert proc.returncode == 0, proc.stderr
    (lv,) = levels
    assert lv["requests_ok"] == 16 and lv["errors_by_kind"] == {} and lv["texts"] == 16
    assert lv["input_tokens"] == lv["server_metrics_delta"]["llamacpp:prompt_tokens_total"]


def test_rerank_of_several_documents_ranks_them_otherwise_than_alone(reranker, tmp_path):
    proc, levels, out = _sweep(reranker.url, tmp_path, "--api", "rerank", "--items", "4", "--concurrency", "1",
                               "--requests", "8", "--warmup", "0")
    assert levels and levels[0]["errors_by_kind"] == {"rank_mismatch": 2}, (levels, proc.stderr)
    messages = _mismatches(out, "rank_mismatch")
    assert all(m.startswith("input ") and ("ranked above" in m or "relevance score" in m) for m in messages), messages
