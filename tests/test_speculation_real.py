"""Speculative decoding on the real test bed: `--spec-type ngram-simple` (drafts from the text so far,
no second model). Each level's acceptance is Σ draft_n_accepted / Σ draft_n of its records, and a
server without speculation reads "no speculation" in the table, never 0%."""

from __future__ import annotations

import pytest

from loadgen.analysis.speculation import NO_SPECULATION
from loadgen.results.reader import load_records, load_run
from servers import start_llama_server, sweep

pytestmark = pytest.mark.real

# A prompt that makes a small model repeat itself, so the n-gram drafter has something to match.
PROMPT = "Count: one two three, one two three, one two three, one two three, one two three,"


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    logs = tmp_path_factory.mktemp("spec-logs")
    # The default lookup n-gram (12 tokens) rarely matches a short run's text: a 3-token lookup and
    # 8-token drafts do on a repeating prompt (checked on build 11434).
    spec = start_llama_server("spec-ngram", 2, logs, extra=("--spec-type", "ngram-simple", "--spec-ngram-simple-size-n",
                                                          "3", "--spec-ngram-simple-size-m", "8"))
    try:
        plain = start_llama_server("spec-none", 2, logs)
    except BaseException:
        spec.stop()
        raise
    yield spec, plain
    spec.stop()
    plain.stop()


def test_each_levels_acceptance_is_the_token_weighted_ratio_of_its_records(servers, tmp_path):
    spec, plain = servers
    out = tmp_path / "run"
    proc = sweep("--url", spec.url, "--url", plain.url, "--concurrency", "1,2", "--requests", "4",
                 "--n-predict", "48", "--temperature", "0", "--prompt", PROMPT, "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    doc, records = load_run(out), load_records(out)
    spec_doc, plain_doc = doc["targets"]
    for level in spec_doc["levels"]:
        mine = [r for r in records if r.target == spec_doc["label"] and r.level == level["level"] and r.ok]
        drafted = sum(r.draft_n or 0 for r in mine)
        accepted = sum(r.draft_n_accepted or 0 for r in mine)
        assert drafted > 0, "the n-gram drafter drafted nothing on a repeating prompt"
        assert (level["draft_n"], level["draft_n_accepted"]) == (drafted, accepted)
        assert level["acceptance"] == pytest.approx(accepted / drafted)
        assert level["drafted_per_output_token"] == pytest.approx(drafted / level["output_tokens"])
    assert all(r.draft_n is None for r in records if r.target == plain_doc["label"])
    assert all("acceptance" not in lv for lv in plain_doc["levels"])
    table = proc.stdout
    assert table.count(NO_SPECULATION) == len(plain_doc["levels"]), table
