"""Input that cannot work is refused before the first request, in every mode, and `run --check`
refuses what the run would (issue 16, item 11)."""

from __future__ import annotations

import pytest

from loadgen.analysis.context import context_overflow
from loadgen.analysis.depth import skip_reason
from servers import SimThread

# The smoke profile's per-slot context is 2048 tokens.


def test_one_check_says_what_does_not_fit():
    assert context_overflow(2000, 96, 2048) == "prompt 2,000 + n_predict 96 > per-slot n_ctx 2,048"
    assert context_overflow(1900, 96, 2048) is None and context_overflow(10**6, 96, None) is None
    assert skip_reason(2000, 96, 2048) == "skipped: " + context_overflow(2000, 96, 2048)


@pytest.mark.parametrize("mode, args", [
    ("sweep", ("--concurrency", "1", "--requests", "2")),
    ("sweep", ("--rate", "5", "--requests", "2")),
    ("soak", ("--concurrency", "1", "--duration", "2s")),
])
def test_prompt_tokens_beyond_the_slot_context_is_refused_before_any_request(loadgen, tmp_path, mode, args):
    with SimThread() as sim:
        url = sim.url
        code, out, err = loadgen(mode, "--url", url, *args, "--prompt-tokens", "3000", "--warmup", "1",
                                 "--output", tmp_path / "run")
        sent = sim.completion_requests()
    assert code == 2, (out, err)
    (line,) = [ln for ln in err.splitlines() if ln.startswith("loadgen: error:")]
    assert "--prompt-tokens 3000" in line and "per-slot n_ctx 2,048" in line and url in line
    assert sent == 0  # not even the warm-up


def test_prompt_tokens_that_fit_still_run(loadgen, tmp_path):
    with SimThread() as sim:
        code, _, err = loadgen("sweep", "--url", sim.url, "--concurrency", "1", "--requests", "2",
                               "--prompt-tokens", "64", "--n-predict", "8", "--warmup", "0",
                               "--output", tmp_path / "run")
    assert code == 0, err


@pytest.mark.parametrize("body, message", [
    ('mode = "sweep"\nports = [9]\nrate = [1.0]\nconcurrency = [1, 2]\n', "not both"),
    ('mode = "sweep"\nports = [9]\narrival = "constant"\n', "need --rate"),
    ('mode = "sweep"\nports = [9]\nprompt = "a"\nprompt_file = "b.txt"\n', "not both"),
    ('mode = "prefill"\nprompt_tokens = [64]\n', "no target"),
    ('mode = "soak"\nports = [9]\ndataset_samples = 3\n', "need --dataset"),
])
def test_check_refuses_what_the_run_would_refuse(loadgen, tmp_path, body, message):
    scenario = tmp_path / "s.toml"
    scenario.write_text(body)
    results = []
    for extra in (("--check",), ()):
        code, out, err = loadgen("run", scenario, *extra, "--set", f"output='{tmp_path / 'out'}'")
        results.append((code, err.strip().splitlines()[-1]))
    assert results[0] == results[1], results
    code, line = results[0]
    assert code == 2 and line.startswith(f"loadgen: error: {scenario}: ") and message in line
    assert not (tmp_path / "out").exists()
