"""prefill, depth and soak end to end on a simulated llama-server (its /tokenize, /props n_ctx, timings)."""

from __future__ import annotations

import pytest

from loadgen.results.reader import load_records, load_run_dict
from servers import SimThread


def test_prefill_reports_each_length_and_skips_one_beyond_the_context(loadgen, simulator, tmp_path):
    out = tmp_path / "prefill"
    code, stdout, err = loadgen("prefill", "--url", simulator, "--prompt-tokens", "64,512,3000", "--repeat", "2",
                                "--output", out)
    assert code == 0, err
    doc = load_run_dict(out)
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
    rows = load_run_dict(out)["targets"][0]["depth"]["rows"]
    assert [r["depth"] for r in rows] == [0, 1024, 4096]
    assert rows[0]["change"] == 0 and rows[0]["note"] == "the shortest prompt there is: the salt alone"
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
    doc = load_run_dict(out)
    soak = doc["targets"][0]["soak"]
    assert doc["kind"] == "soak" and doc["complete"] is True
    assert soak["requests_failed"] == 0 and soak["requests_ok"] > 10
    assert soak["error_free_s"] == soak["duration_s"] and soak["window_s"] == 1 and len(soak["windows"]) >= 3
    assert doc["targets"][0]["levels"][0]["concurrency"] == 2  # compare and gate read it as a level
    assert "soak 0:00:0" in err  # the status line, printed at each checkpoint when not a terminal


def test_soak_against_a_server_failing_30_percent_offers_the_load_of_a_sweep(loadgen, tmp_path):
    # A soak pauses a worker only when it cannot connect: against a live server that answers 30%
    # of requests with an instant HTTP 500, its load (and so its throughput) is a sweep's, and
    # run.json says how many requests per second it offered.
    with SimThread(faults=["http_500:0.3"], slots=2) as sim:
        code, _, err = loadgen("soak", "--url", sim.url, "--concurrency", "2", "--duration", "3s",
                               "--n-predict", "8", "--warmup", "0", "--output", tmp_path / "soak")
        assert code == 0, err
        code, _, err = loadgen("sweep", "--url", sim.url, "--concurrency", "2", "--duration", "3",
                               "--n-predict", "8", "--warmup", "0", "--no-histograms", "--output", tmp_path / "sweep")
        assert code == 0, err
    doc = load_run_dict(tmp_path / "soak")
    soak = doc["targets"][0]["soak"]
    records = load_records(tmp_path / "soak")
    assert soak["requests_failed"] > 5 and set(soak["errors_by_kind"]) == {"http_500"}
    assert soak["requests_sent"] == len(records)
    assert soak["offered_req_s"] == pytest.approx(len(records) / soak["duration_s"])
    # after each failure, the same worker's next request follows at once (no 1 s back-off)
    by_worker: dict[int, list] = {}
    for r in sorted(records, key=lambda r: r.send_ns):
        by_worker.setdefault(r.worker, []).append(r)
    gaps = [(b.send_ns - a.complete_ns) / 1e9 for rs in by_worker.values() for a, b in zip(rs, rs[1:]) if not a.ok]
    assert gaps and max(gaps) < 0.5, gaps
    sweep_tok_s = load_run_dict(tmp_path / "sweep")["targets"][0]["levels"][0]["throughput_tok_s"]
    assert soak["throughput_tok_s"] > 0.6 * sweep_tok_s, (soak["throughput_tok_s"], sweep_tok_s)
    code, out, _ = loadgen("analyze", tmp_path / "soak")
    assert code == 0 and "offered" in out and f"{soak['offered_req_s']:,.2f}" in out


def test_a_soak_with_an_slo_reports_attainment_and_goodput_per_window_and_overall(loadgen, simulator, tmp_path):
    out = tmp_path / "soak"
    code, stdout, err = loadgen("soak", "--url", simulator, "--concurrency", "2", "--duration", "3s", "--stream",
                                "--checkpoint-interval", "1s", "--n-predict", "8", "--slo", "ttft=10s,e2e=30s",
                                "--attainment", "0.95", "--output", out)
    assert code == 0, err
    doc = load_run_dict(out)
    soak, level = doc["targets"][0]["soak"], doc["targets"][0]["levels"][0]
    # A simulator answers 8 tokens in far less than 10 s: every judged request is good.
    assert soak["slo"]["judged"] == soak["slo"]["good"] == soak["requests_ok"] > 10
    assert soak["slo"]["attainment"] == 1.0 and soak["slo"]["passed"] is True and soak["slo"]["required"] == 0.95
    assert soak["slo"]["goodput_req_s"] == pytest.approx(soak["requests_ok"] / soak["duration_s"])
    assert sum(w["good"] for w in soak["windows"]) == soak["slo"]["good"]
    assert all(w["attainment"] == 1.0 for w in soak["windows"] if w["judged"])
    assert soak["slo"]["falling"] is False
    assert level["slo"]["good"] == soak["slo"]["good"] and level["slo"]["passed"] is True  # the level's judgement too
    assert "attain" in stdout and "100% → 100% (within noise)" in stdout


@pytest.mark.parametrize("flags, message", [
    (("--slo", "ttft=500ms"), "--slo ttft is measured on streamed responses only; add --stream"),
    (("--slo", "e2e=1s", "--workers", "2"), "--slo judges every request in this process"),
    (("--attainment", "0.8"), "--attainment applies to --slo"),
])
def test_a_soak_refuses_an_slo_it_cannot_judge_before_any_request(loadgen, tmp_path, flags, message):
    code, _, err = loadgen("soak", "--url", "http://127.0.0.1:9", "--duration", "2s", *flags,
                           "--output", tmp_path / "soak")
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "soak").exists()


@pytest.mark.parametrize("mode, body, valid", [
    ("soak", 'slo = "e2e=8s"\nattainment = 0.95\n', True),
    ("soak", 'slo = "ttft=500ms"\nstream = true\n', True),
    ("soak", 'slo = "ttft=500ms"\n', False),
    ("sweep", 'slo = "ttft=500ms,tpot=50ms"\nstream = true\n', True),
    ("sweep", 'slo = "tpot=50ms"\n', False),
])
def test_a_scenario_takes_the_slo_keys_for_soak_and_sweep(loadgen, tmp_path, mode, body, valid):
    path = tmp_path / "slo.toml"
    path.write_text(f'mode = "{mode}"\nurl = ["http://127.0.0.1:9"]\n{body}')
    code, out, err = loadgen("run", path, "--check")
    if valid:
        assert code == 0 and "all valid" in out + err, err
    else:
        assert code == 2 and f"{path}: --slo" in err and "add --stream" in err, err
