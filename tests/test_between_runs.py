"""The between-runs test: runs are the unit, drift shared by interleaved pairs cancels, a noise
floor lets single runs be judged, and with nothing to judge noise by there is no verdict.
Expected answers were written down before the first run of this file."""

from __future__ import annotations

import math

import numpy as np
import pytest

from loadgen.analysis.between_runs import (
    FLOOR_ONLY,
    PAIRED,
    UNPAIRED,
    UNTESTED,
    Floor,
    calibrate,
    interleaved,
    run_effect,
)

A = 0.05

# (baseline runs, candidate runs, paired, floor, expected method, expected significant)
CASES = [
    ([100, 100, 100], [100, 100, 100], True, None, PAIRED, False),  # identical
    ([100, 80, 120], [95, 78, 118], False, None, UNPAIRED, False),  # drift only
    ([100, 80, 120], [95, 78, 118], True, None, PAIRED, False),  # drift only, paired: pairs differ 2-5%
    ([100, 80, 120], [80, 64, 96], True, None, PAIRED, True),  # -20% in every pair under heavy drift
    ([100, 80, 120], [80, 64, 96], False, None, UNPAIRED, False),  # the same, unpaired: drift hides it
    ([100], [80], False, None, UNTESTED, None),  # one run a side, no floor: no verdict
    ([100], [80], False, Floor(0.05, 10), FLOOR_ONLY, True),  # -20% against a 5% floor
    ([100], [95], False, Floor(0.05, 10), FLOOR_ONLY, False),  # -5% inside it
    ([100], [80], False, Floor(0.10, 10), FLOOR_ONLY, False),  # -20% inside a 10% floor
    ([100, 0], [80, 70], False, None, UNTESTED, None),  # a zero has no ratio
    ([101, 99, 100], [76, 74, 75], False, Floor(0.02, 8), UNPAIRED, True),
]


@pytest.mark.parametrize("base,cand,paired,floor,method,significant", CASES)
def test_the_table(base, cand, paired, floor, method, significant):
    effect = run_effect(base, cand, A, paired=paired, floor=floor)
    assert effect.method == method
    assert effect.significant is significant
    if effect.ratio is not None:
        geo = math.exp(np.mean(np.log(cand)) - np.mean(np.log(base)))
        assert effect.ratio == pytest.approx(geo)


def test_the_interval_and_p_value_are_students_t_on_logs():
    base, cand = [100, 90, 110, 105], [90, 85, 97, 93]
    e = run_effect(base, cand, A)
    lb, lc = np.log(base), np.log(cand)
    sp = math.sqrt((((lb - lb.mean()) ** 2).sum() + ((lc - lc.mean()) ** 2).sum()) / 6)
    se = sp * math.sqrt(0.5)
    from scipy import stats
    t = (lc.mean() - lb.mean()) / se
    assert e.df == 6 and e.sigma == pytest.approx(sp)
    assert e.p_value == pytest.approx(2 * stats.t.sf(abs(t), 6))
    assert e.ci_low == pytest.approx(math.exp(lc.mean() - lb.mean() - stats.t.ppf(0.975, 6) * se))
    assert e.detectable == pytest.approx(math.expm1((stats.t.ppf(0.975, 6) + stats.t.ppf(0.8, 6)) * se))


def test_more_runs_or_a_floor_detect_smaller_changes():
    one = run_effect([100], [100], A, floor=Floor(0.05, 10)).detectable
    three = run_effect([100, 101, 99], [100, 99, 101], A, floor=Floor(0.05, 10)).detectable
    assert three < one
    # the same 5% spread seen by 2+2 runs alone (2 df): a wide t, so only larger changes are found
    assert run_effect([100, 107.4], [100, 93.1], A).detectable > run_effect([100, 107.4], [100, 93.1], A,
                                                                            floor=Floor(0.05, 10)).detectable


def test_calibration_uses_successive_runs_within_groups_only():
    floor = calibrate([[100, 110, 90], [50, 55, 45], [7]])  # levels differ 2x; a lone run adds nothing
    diffs = [math.log(110 / 100), math.log(90 / 110), math.log(55 / 50), math.log(45 / 55)]
    assert floor == Floor(pytest.approx(math.sqrt(sum(d * d for d in diffs) / 8)), 4)
    assert calibrate([[5], [6]]) is None
    # a steady climb (drift) of 2% per run with no scatter: successive differences see 2%, not the 10% span
    climb = calibrate([[100 * 1.02 ** i for i in range(6)]])
    assert climb.sigma == pytest.approx(math.log(1.02) / math.sqrt(2))


def test_interleaving_is_read_from_the_start_times():
    assert interleaved([0, 2, 4], [1, 3, 5])
    assert interleaved([1, 3], [0, 2])
    assert interleaved([0, 3, 4], [1, 2, 5])  # counterbalanced: A B  B A  A B
    assert not interleaved([0, 1, 4], [2, 3, 5])  # A A B B A B: the first two are not a pair
    assert not interleaved([0, 1, 2], [3, 4, 5])
    assert not interleaved([0, 2], [1, 3, 5])
    assert not interleaved([0], [1])


def machine(rng, runs, step_sd=0.05, noise_sd=0.03):
    """Successive runs on a machine whose speed drifts (a random walk, `step_sd` per run) with
    `noise_sd` of scatter per run: values near 100."""
    return 100 * np.exp(np.cumsum(rng.normal(0, step_sd, runs)) + rng.normal(0, noise_sd, runs))


def ab_gate(rng, pairs, effect, paired, floor):
    """A B A B ... on that machine; the candidate runs are slower by `effect`."""
    values = machine(rng, 2 * pairs)
    base, cand = values[0::2], values[1::2] * (1 + effect)
    return run_effect(list(base), list(cand), A, paired=paired, floor=floor)


def test_false_alarms_stay_near_alpha_and_a_25_percent_drop_is_found():
    """On a drifting machine, A/A gates of 3+3 interleaved runs, each with a fresh 11-run A/A
    calibration, call a change in about alpha of the trials; a -25% change is found in >= 90%."""
    rng = np.random.default_rng(7)
    trials = 400
    alarms = caught = 0
    for _ in range(trials):
        floor = calibrate([machine(rng, 11)])
        assert floor.df == 10
        alarms += bool(ab_gate(rng, 3, 0.0, True, floor).significant)
        caught += bool(ab_gate(rng, 3, -0.25, True, floor).significant)
    assert alarms <= trials * A * 1.5
    assert caught >= trials * 0.9
