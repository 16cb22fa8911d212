"""--lora-mix against the real llama-server test bed (build 11434) with two LoRA adapters that the
test writes (tests/lora_gguf.py: random rank-8 weights for SmolLM2's attention): every request's
adapter is recorded and equals what the server says it applied; the output tokens of a level equal
the server's `llamacpp:tokens_predicted_total` increase; an adapter id the server lacks is refused
before the first level; `loadgen ab` sets one adapter against a mix of two (docs/lora.md)."""

from __future__ import annotations

import http.server
import json
import subprocess
from collections import Counter

import pytest

from loadgen.core.errors import EXIT_FAILED, EXIT_USAGE
from loadgen.results.reader import load_records, load_run_dict
from lora_gguf import write_lora_adapter
from servers import LOADGEN, serve_handler, start_llama_server, sweep
from servers import testbed_paths as bed_paths

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def adapters_server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lora")
    _, model = bed_paths()
    files = [write_lora_adapter(folder / f"adapter-{i}.gguf", model, seed=i) for i in range(2)]
    # build 11434 takes several adapters comma-separated (a repeated --lora keeps only the last)
    server = start_llama_server("lora", 4, folder, extra=("--lora", ",".join(map(str, files))))
    yield server
    server.stop()


def _levels(out):
    return load_run_dict(out)["targets"][0]["levels"]


def test_a_mix_of_two_adapters_records_each_requests_adapter_as_the_server_applied_it(adapters_server, tmp_path):
    out = tmp_path / "run"
    proc = sweep("--url", adapters_server.url, "--concurrency", "4", "--requests", "12", "--n-predict", "8",
                 "--stream", "--warmup", "1", "--lora-mix", "0:1,1:1", "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    records = load_records(out)
    assert len(records) == 12 and all(r.ok for r in records), [r.error_message for r in records]
    assert Counter(r.lora for r in records) == {"0": 6, "1": 6}
    assert all(r.lora == ("0", "1")[r.seq % 2] for r in records)  # deterministic by request index
    assert [r.seq for r in records if r.lora_applied != r.lora] == []  # the server's own generation_settings.lora
    level, = _levels(out)
    assert level["output_tokens"] == sum(r.output_tokens for r in records) == 12 * 8
    assert level["output_tokens"] == level["server_metrics_delta"]["llamacpp:tokens_predicted_total"], level
    assert load_run_dict(out)["config"]["lora_mix"] == "0:1,1:1"
    assert "LoRA adapters per request" in proc.stdout and "as asked (6)" in proc.stdout


def test_none_and_a_whole_answer_are_checked_too(adapters_server, tmp_path):
    out = tmp_path / "run"
    proc = sweep("--url", adapters_server.url, "--concurrency", "2", "--requests", "6", "--n-predict", "6",
                 "--warmup", "0", "--lora-mix", "1:2,none:1", "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    records = load_records(out)
    assert Counter(r.lora for r in records) == {"1": 4, "none": 2}
    assert all(r.ok and r.lora_applied == r.lora for r in records), records
    level, = _levels(out)
    assert level["output_tokens"] == level["server_metrics_delta"]["llamacpp:tokens_predicted_total"] == 36


def test_an_adapter_id_the_server_lacks_is_refused_before_the_first_level(adapters_server, tmp_path):
    proc = sweep("--url", adapters_server.url, "--concurrency", "4", "--requests", "4", "--n-predict", "4",
                 "--lora-mix", "0:1,2:1", "--output", str(tmp_path / "run"))
    assert proc.returncode == EXIT_USAGE, proc.stderr
    line, = [x for x in proc.stderr.splitlines() if "error" in x]
    assert "--lora-mix asks for adapter 2" in line and "has 2 (ids 0-1" in line
    assert not (tmp_path / "run" / "requests.jsonl").exists() or not load_records(tmp_path / "run")


class _NoAdapters(http.server.BaseHTTPRequestHandler):
    """A server that is up and has no adapters: /health ok, /lora-adapters [] (llama-server without --lora)."""

    def do_GET(self):
        body = {"/health": b'{"status":"ok"}', "/lora-adapters": b"[]"}.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body or b"{}")

    def log_message(self, *args):
        pass


def test_a_server_without_adapters_is_told_from_its_answer(tmp_path):
    with serve_handler(_NoAdapters) as url:
        proc = sweep("--url", url, "--concurrency", "1", "--requests", "1", "--lora-mix", "0:1",
                     "--output", str(tmp_path / "run"), timeout=120)
    assert proc.returncode == EXIT_FAILED, proc.stderr
    assert "has no LoRA adapters loaded" in proc.stderr


def test_ab_sets_one_adapter_against_a_mix_of_two(adapters_server, tmp_path):
    out = tmp_path / "ab"
    proc = subprocess.run([*LOADGEN, "ab", "--baseline-url", adapters_server.url, "--candidate-url",
                           adapters_server.url, "--repeat", "2", "--output", str(out),
                           "--baseline-args", "--lora-mix 0:1", "--candidate-args", "--lora-mix 0:1,1:1",
                           "--", "--concurrency", "4", "--requests", "8", "--n-predict", "8", "--warmup", "1"],
                          capture_output=True, text=True, timeout=600)
    # the gate's verdict (0 pass, 1 a drop, 3 not enforced, 4 the machine changed) is the machine's to give
    assert proc.returncode in (0, 1, 3, 4), proc.stdout + proc.stderr
    assert "gate" in proc.stdout + proc.stderr
    assert json.loads((out / "ab.json").read_text())["candidate_args"] == ["--lora-mix", "0:1,1:1"]
    for side, asked in (("baseline", {"0"}), ("candidate", {"0", "1"})):
        for run in ("01", "02"):
            records = load_records(out / side / run)
            assert {r.lora for r in records} == asked and all(r.lora_applied == r.lora for r in records)
