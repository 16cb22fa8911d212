"""The speculation on/off recipe on the real test bed: a `grid --repeat 3` of llama-server with
`--spec-type none` and `ngram-simple` over c = 1, 2, 4, then `loadgen crossover`. Whatever the
machine's noise decides, each level's verdict, change and interval are those its three pairs of
repeats give (a paired t interval on the log ratio, recomputed here), the sentence follows the
levels' verdicts, and `--format json` carries it all. Kept short: tiny runs (4 requests of 6 tokens
a level), so one boot and sweep of each cell takes seconds."""

from __future__ import annotations

import json
import math

import pytest
from scipy import stats

from loadgen.analysis.crossover import COSTS, INCONCLUSIVE, PAYS
from loadgen.results.crossover import spec_sides
from servers import grid
from servers import testbed_paths as server_and_model  # not collected as a test

pytestmark = [pytest.mark.real, pytest.mark.timeout(300)]

PROMPT = "Count: one two three, one two three, one two three, one two three, one two three,"
REPEATS = 3


def _expected(on: list[float], off: list[float]) -> tuple[str, float, float]:
    """(verdict, change, half-width) of one level from its repeats: the paired t interval (95%) of
    mean log(on/off), as ratios; pays when its low end is above 1, costs when its high end is below."""
    d = [math.log(a) - math.log(b) for a, b in zip(on, off)]
    n = len(d)
    mean = sum(d) / n
    se = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1) / n)
    t = float(stats.t.ppf(0.975, n - 1))
    low, high = math.exp(mean - t * se), math.exp(mean + t * se)
    verdict = PAYS if low > 1 else COSTS if high < 1 else INCONCLUSIVE
    return verdict, math.exp(mean) - 1, (high - low) / 2


def _sentence_start(verdicts: list[str]) -> str:
    if all(v == PAYS for v in verdicts):
        return "speculation pays at every level tested"
    if all(v == COSTS for v in verdicts):
        return "speculation costs at every level tested"
    first_not_paying = next(i for i, v in enumerate(verdicts) if v != PAYS)
    if first_not_paying > 0 and all(v == COSTS for v in verdicts[first_not_paying:]):
        return "speculation pays up to c="
    return "no clear crossover"


def test_the_recipe_prints_a_verdict_consistent_with_its_repeats(tmp_path, loadgen):
    binary, model = server_and_model()
    out = tmp_path / "grid"
    proc = grid("--server", f"{binary} -m {model} --parallel 4 -c 1024 -t 1 --no-warmup --metrics --spec-type {{spec}} "
                            "--spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m 8",
                "--param", "spec=none,ngram-simple", "--repeat", str(REPEATS), "--concurrency", "1,2,4",
                "--requests", "4", "--n-predict", "6", "--temperature", "0", "--prompt", PROMPT, "--warmup", "1",
                "--output", str(out), timeout=240)
    assert proc.returncode == 0, proc.stderr
    code, stdout, err = loadgen("crossover", str(out), "--param", "spec", "--on", "ngram-simple", "--off", "none",
                                "--format", "json")
    assert code == 0, err
    doc = json.loads(stdout)
    on, off = spec_sides(out, "spec", "ngram-simple", "none")
    assert [lv["level"] for lv in doc["levels"]] == [1, 2, 4]
    for lv in doc["levels"]:
        level = lv["level"]
        assert lv["repeats"] == REPEATS == len(on[level]) == len(off[level])
        verdict, change, half = _expected(on[level], off[level])
        assert lv["change"] == pytest.approx(change)
        assert lv["half_width"] == pytest.approx(half)
        assert lv["verdict"] == verdict
    assert doc["verdict"].startswith(_sentence_start([lv["verdict"] for lv in doc["levels"]]))
    code, table, err = loadgen("crossover", str(out), "--param", "spec", "--on", "ngram-simple", "--off", "none")
    assert code == 0, err
    assert " ".join(doc["verdict"].split()) in " ".join(table.split())
    print(doc["verdict"])
