"""The speculation on/off recipe on the real test bed: a `grid --repeat 2` of llama-server with
`--spec-type none` and `ngram-simple` over c = 1, 2, 4, then `loadgen crossover`. Whatever the
machine's noise decides, each level's verdict agrees with its repeats (pays only above 1, costs only
below) and `--format json` carries the sentence."""

from __future__ import annotations

import json

import pytest

from loadgen.analysis.crossover import COSTS, PAYS
from servers import grid
from servers import testbed_paths as server_and_model  # not collected as a test

# Two cells × two repeats, each a server boot and a sweep of three levels: minutes on a shared machine.
pytestmark = [pytest.mark.real, pytest.mark.timeout(900)]

PROMPT = "Count: one two three, one two three, one two three, one two three, one two three,"


def test_the_recipe_prints_a_verdict_consistent_with_its_repeats(tmp_path, loadgen):
    binary, model = server_and_model()
    out = tmp_path / "grid"
    proc = grid("--server", f"{binary} -m {model} --parallel 4 -c 4096 -t 1 --metrics --spec-type {{spec}} "
                            "--spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m 8",
                "--param", "spec=none,ngram-simple", "--repeat", "2", "--concurrency", "1,2,4", "--requests", "4",
                "--n-predict", "24", "--temperature", "0", "--prompt", PROMPT, "--warmup", "1", "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    code, stdout, err = loadgen("crossover", str(out), "--param", "spec", "--on", "ngram-simple", "--off", "none",
                                "--format", "json")
    assert code == 0, err
    doc = json.loads(stdout)
    assert [lv["level"] for lv in doc["levels"]] == [1, 2, 4]
    for lv in doc["levels"]:
        assert lv["repeats"] == 2 and lv["change"] is not None
        if lv["verdict"] == PAYS:
            assert lv["change"] > 0
        if lv["verdict"] == COSTS:
            assert lv["change"] < 0
    assert doc["verdict"].startswith(("speculation pays", "speculation costs", "no clear crossover"))
    print(doc["verdict"])
