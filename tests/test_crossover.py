"""The speculation on/off verdict: a table of cases whose answers were written before running."""

from __future__ import annotations

import pytest

from loadgen.analysis.crossover import COSTS, INCONCLUSIVE, PAYS, crossover

# Throughput of three repeats per level; "on" is "off" times a factor with small, paired noise.
NOISE = (1.00, 1.01, 0.99)


def side(factor: float, base: float = 100.0) -> list[float]:
    return [base * factor * n for n in NOISE]


def off(*levels: int) -> dict[int, list[float]]:
    return {lv: [100.0 * n for n in NOISE] for lv in levels}


CASES = [
    # (on factors per level 1, 2, 4; expected verdicts; expected sentence start; pays_up_to, costs_from)
    ((1.31, 1.20, 1.10), [PAYS, PAYS, PAYS], "speculation pays at every level tested", 4, None),
    ((0.80, 0.70, 0.60), [COSTS, COSTS, COSTS], "speculation costs at every level tested", None, 1),
    ((1.31, 1.30, 0.82), [PAYS, PAYS, COSTS], "speculation pays up to c=2 +30%", 2, 4),
    ((1.31, 0.82, 0.70), [PAYS, COSTS, COSTS], "speculation pays up to c=1 +31%", 1, 2),
    ((1.31, 1.00, 0.80), [PAYS, INCONCLUSIVE, COSTS], "no clear crossover", 1, None),
    ((0.80, 1.30, 1.30), [COSTS, PAYS, PAYS], "no clear crossover", None, None),
]


@pytest.mark.parametrize("factors,verdicts,sentence,pays_up_to,costs_from", CASES)
def test_crossover_verdicts(factors, verdicts, sentence, pays_up_to, costs_from):
    found = crossover({lv: side(f) for lv, f in zip((1, 2, 4), factors)}, off(1, 2, 4))
    assert [e.verdict for e in found.levels] == verdicts
    assert found.sentence.startswith(sentence), found.sentence
    assert (found.pays_up_to, found.costs_from) == (pays_up_to, costs_from)


def test_the_sentence_carries_each_side_of_the_crossover_with_its_interval():
    found = crossover({1: side(1.31), 2: side(1.31), 4: side(0.82)}, off(1, 2, 4))
    assert found.sentence.startswith("speculation pays up to c=2 +31% ± ") and ", costs from c=4 −18% ± " in \
        found.sentence


def test_noise_as_large_as_the_effect_is_inconclusive_and_one_repeat_is_never_judged():
    noisy_on = {1: [130.0, 80.0, 120.0]}
    noisy_off = {1: [100.0, 110.0, 90.0]}
    assert crossover(noisy_on, noisy_off).levels[0].verdict == INCONCLUSIVE
    single = crossover({1: [200.0]}, {1: [100.0]})
    assert single.levels[0].verdict == INCONCLUSIVE and single.levels[0].change == pytest.approx(1.0)


def test_json_carries_the_verdict_and_every_level():
    doc = crossover({1: side(1.2)}, off(1)).to_dict()
    assert doc["verdict"].startswith("speculation pays at every level") and doc["levels"][0]["verdict"] == PAYS
