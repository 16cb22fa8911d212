"""The three APIs, streamed and not, against the real llama-server test bed."""

from __future__ import annotations

import pytest

from loadgen.analysis import metrics
from loadgen.results.reader import load_records, load_run_dict
from servers import sweep

pytestmark = pytest.mark.real


@pytest.mark.parametrize("stream", ["--stream", "--no-stream"])
@pytest.mark.parametrize("api", ["llamacpp", "completions", "chat"])
def test_every_api_records_the_servers_token_counts(real_servers, tmp_path, api, stream):
    four, _ = real_servers
    out = tmp_path / "run"
    proc = sweep("--url", four.url, "--api", api, stream, "--concurrency", "2", "--requests", "2",
                 "--n-predict", "8", "--warmup", "1", "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    records = load_records(out)
    assert len(records) == 2
    for r in records:
        assert r.ok, r.error_message
        assert r.predicted_n == 8 and r.output_tokens == 8  # --ignore-eos: exactly n_predict
        assert r.prompt_n and r.prompt_ms is not None  # llama-server sends timings on every API
        if api == "llamacpp":
            assert r.tokens_predicted == 8 and r.stop_type == "limit" and r.usage is None
        else:
            assert r.usage is not None and r.usage.completion_tokens == 8 and r.finish_reason == "length"
        if stream == "--stream":
            # /completion's stream ends with stop:true and no [DONE]: still complete, not truncated
            assert r.chunks and 1 <= r.chunks <= 8 and len(r.chunk_gaps_us) == r.chunks - 1
            assert 0 < metrics.ttft_ms(r) < metrics.latency_ms(r)
            assert metrics.tpot_ms(r) > 0
        else:
            assert r.chunks is None and r.first_token_ns is None
    doc = load_run_dict(out)
    assert doc["config"]["api"] == api and doc["config"]["stream"] == (stream == "--stream")
    level = doc["targets"][0]["levels"][0]
    assert level["output_tokens"] == 16
    assert (level["ttft_ms"] is not None) == (stream == "--stream")
    if api != "llamacpp":
        assert doc["targets"][0]["server"]["models"]  # the model name came from /v1/models
