"""Drawn workloads on a real llama-server (issue 35): every request's prompt_n is its drawn length
(the salt, the BOS token and, with --api chat, the chat template are inside the count: no overhead
on top), its predicted_n its drawn answer length, and the drawn lengths follow the asked
distribution."""

from __future__ import annotations

import subprocess

import pytest

from loadgen.core.workload import Workload, parse_length_spec
from loadgen.results.reader import load_records, load_run
from servers import LOADGEN, start_llama_server

stats = pytest.importorskip("scipy.stats")
pytestmark = pytest.mark.real

# Lengths small enough for a loaded test machine; the lowest above what --api chat's template and
# the salt take (69 tokens on SmolLM2).
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
    level = load_run(out)["targets"][0]["levels"][0]
    assert level["prompt_n"]["max"] == max(sent) and level["prompt_n"]["count"] == requests
