"""prefill, depth and soak end to end on a simulated llama-server (its /tokenize, /props n_ctx, timings)."""

from __future__ import annotations

from loadgen.results.reader import load_records, load_run


def test_prefill_reports_each_length_and_skips_one_beyond_the_context(loadgen, simulator, tmp_path):
    out = tmp_path / "prefill"
    code, stdout, err = loadgen("prefill", "--url", simulator, "--prompt-tokens", "64,512,3000", "--repeat", "2",
                                "--output", out)
    assert code == 0, err
    doc = load_run(out)
    assert doc["kind"] == "prefill" and doc["complete"] is True
    section = doc["targets"][0]["prefill"]
    assert section["n_ctx"] == 2048
    rows = {r["prompt_tokens"]: r for r in section["rows"]}
    for n in (64, 512):
        assert rows[n]["requests_ok"] == 2 and rows[n]["prompt_n_min"] == rows[n]["prompt_n_max"] == n
        assert rows[n]["prompt_tok_s"]["mean"] > 0 and rows[n]["ttft_ms"]["sd"] is not None
    assert rows[512]["prompt_ms"]["mean"] > rows[64]["prompt_ms"]["mean"]
    assert rows[3000]["skipped"] == "skipped: prompt 3,000 + n_predict 1 > per-slot n_ctx 2,048"
    assert rows[3000]["requests_ok"] == 0
    records = load_records(out)
    assert sorted({r.prompt_tokens_target for r in records}) == [64, 512]
    assert all(r.cache_n == 0 and r.predicted_n == 1 for r in records)
    assert "loadgen prefill" in stdout and "per-slot n_ctx 2,048" in stdout


def test_depth_reports_the_change_against_depth_zero(loadgen, simulator, tmp_path):
    out = tmp_path / "depth"
    code, stdout, err = loadgen("depth", "--url", simulator, "--depths", "0,1024,4096", "--n-predict", "8",
                                "--repeat", "1", "--output", out)
    assert code == 0, err
    rows = load_run(out)["targets"][0]["depth"]["rows"]
    assert [r["depth"] for r in rows] == [0, 1024, 4096]
    assert rows[0]["change"] == 0 and rows[0]["note"] == "the shortest prompt there is: the uuid salt alone"
    assert rows[1]["prompt_n"]["mean"] == 1024 and rows[1]["change"] is not None
    assert rows[1]["decode_tok_s"]["mean"] > 0 and rows[1]["reference_depth"] == 0
    assert rows[2]["skipped"].startswith("skipped: prompt 4,096 + n_predict 8 > per-slot n_ctx")
    assert "vs depth 0" in stdout and "analyze" not in err
    code, again, _ = loadgen("analyze", out)  # the table again, from the files alone
    assert code == 0 and "loadgen depth" in again


def test_a_short_soak_writes_its_summary(loadgen, simulator, tmp_path):
    out = tmp_path / "soak"
    code, stdout, err = loadgen("soak", "--url", simulator, "--concurrency", "2", "--duration", "3s",
                                "--checkpoint-interval", "1s", "--n-predict", "8", "--output", out)
    assert code == 0, err
    doc = load_run(out)
    soak = doc["targets"][0]["soak"]
    assert doc["kind"] == "soak" and doc["complete"] is True
    assert soak["requests_failed"] == 0 and soak["requests_ok"] > 10
    assert soak["error_free_s"] == soak["duration_s"] and soak["window_s"] == 1 and len(soak["windows"]) >= 3
    assert doc["targets"][0]["levels"][0]["concurrency"] == 2  # compare and gate read it as a level
    assert "soak 0:00:0" in err  # the status line, printed at each checkpoint when not a terminal
