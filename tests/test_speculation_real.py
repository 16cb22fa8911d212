"""Speculative decoding on the real test bed: `--spec-type ngram-simple` (drafts from the text so far,
no second model) and `-md` with the model as its own draft. Each level's acceptance is
Σ draft_n_accepted / Σ draft_n of its records; the servers' /slots say they speculate (run.json's
`server.speculative`), and a server without speculation (here one given `-md` but no `--spec-type`,
which build 11434 loads and does not draft with) reads "no speculation" in the table, never 0%.
Kept short: tiny runs of three 2-slot servers of a 135M model."""

from __future__ import annotations

import pytest

from loadgen.analysis.speculation import NO_SPECULATION
from loadgen.results.reader import load_records, load_run_dict
from servers import start_llama_server, sweep
from servers import testbed_paths as server_and_model  # not collected as a test

pytestmark = [pytest.mark.real, pytest.mark.timeout(300)]

# A prompt that makes a small model repeat itself, so the n-gram drafter has something to match.
PROMPT = "Count: one two three, one two three, one two three, four five six, one two three, four five"


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    logs = tmp_path_factory.mktemp("spec-logs")
    _, model = server_and_model()
    started = []
    try:
        # The default lookup n-gram (12 tokens) rarely matches a short run's text: a 3-token lookup and
        # 8-token drafts do on a repeating prompt (checked on build 11434).
        started.append(start_llama_server("spec-ngram", 2, logs, extra=(
            "--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "8")))
        # The model as its own draft: the drafter proposes what the model would say.
        started.append(start_llama_server("spec-draft", 2, logs, extra=(
            "--spec-type", "draft-simple", "-md", model, "--spec-draft-n-max", "4", "-td", "1")))
        # A draft model without --spec-type: loaded, but build 11434 does not draft with it, and /slots
        # says so (the old habit of `-md` alone turning speculation on is gone).
        started.append(start_llama_server("spec-none", 2, logs, extra=("-md", model, "-td", "1")))
    except BaseException:
        for s in started:
            s.stop()
        raise
    yield started
    for s in started:
        s.stop()


def test_each_levels_acceptance_is_the_token_weighted_ratio_of_its_records(servers, tmp_path):
    out = tmp_path / "run"
    proc = sweep(*(a for s in servers for a in ("--url", s.url)), "--concurrency", "1,2", "--requests", "4",
                 "--n-predict", "24", "--temperature", "0", "--prompt", PROMPT, "--output", str(out), timeout=240)
    assert proc.returncode == 0, proc.stderr
    doc, records = load_run_dict(out), load_records(out)
    *drafting, plain_doc = doc["targets"]
    for target in drafting:
        assert target["server"]["speculative"] is True, target["server"]
        for level in target["levels"]:
            mine = [r for r in records if r.target == target["label"] and r.level == level["level"] and r.ok]
            drafted = sum(r.draft_n or 0 for r in mine)
            accepted = sum(r.draft_n_accepted or 0 for r in mine)
            assert drafted > 0, f"{target['label']} drafted nothing at c={level['level']}"
            assert (level["draft_n"], level["draft_n_accepted"]) == (drafted, accepted)
            assert level["acceptance"] == pytest.approx(accepted / drafted)
            assert level["drafted_per_output_token"] == pytest.approx(drafted / level["output_tokens"])
            print(f"{target['label']} c={level['level']}: {accepted}/{drafted} accepted "
                  f"({accepted / drafted:.1%}), {drafted / level['output_tokens']:.2f} drafted per output token")
    assert plain_doc["server"]["speculative"] is False, plain_doc["server"]
    assert all(r.draft_n is None for r in records if r.target == plain_doc["label"])
    assert all("acceptance" not in lv for lv in plain_doc["levels"])
    assert proc.stdout.count(NO_SPECULATION) == len(plain_doc["levels"]), proc.stdout
