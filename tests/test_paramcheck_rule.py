"""The paramcheck verdict rule (analysis/paramcheck_verdict.py), as a table. Expected answers written before running."""

from __future__ import annotations

import pytest

from loadgen.analysis.paramcheck_verdict import (
    ALTERED,
    CANNOT_TELL,
    DROPPED,
    HONOURED,
    UNSEEN,
    CanaryAnswer,
    Observation,
    exit_code,
    judge,
    judge_observation,
    verdicts,
)

U = UNSEEN
# (direct, via, default) -> verdict of one observation (None: no evidence)
ONE = [
    ((0.55, 0.55, 0.8), HONOURED),
    ((0.550000011920929, 0.55, 0.800000011920929), HONOURED),  # float32 echo of 0.55
    ((0.55, 0.800000011920929, 0.8), DROPPED),
    ((0.55, 0.3, 0.8), ALTERED),
    ((4242, 4294967295, 4294967295), DROPPED),  # seed sent, the server default seen: a drop
    ((7, 16, -1), ALTERED),  # max_tokens rewritten
    ((7, -1, -1), DROPPED),
    ((0.8, 0.8, 0.8), None),  # the server shows its default either way: no evidence
    ((0.55, U, 0.8), None),  # nothing read through the gateway
    ((U, 0.55, 0.8), None),  # nothing read directly
    ((7, 7, U), HONOURED),  # an effect without a known default
    ((7, 12, U), ALTERED),  # ... and a different one: never "dropped" without a default
    ((True, False, False), DROPPED),  # log-probabilities came back directly, not through the gateway
    ((False, False, False), None),  # the server gives none either way
    ((["<s>"], [], []), DROPPED),  # stop in generation_settings
    ((["<s>"], ["<s>"], []), HONOURED),
    ((1, True, 0), ALTERED),  # a bool is not the number 1
]


@pytest.mark.parametrize("seen,expected", ONE, ids=[repr(s) for s, _ in ONE])
def test_one_observation(seen, expected):
    assert judge_observation(Observation("x", *seen)) == expected


# observations of one parameter -> its verdict
MANY = [
    ([], CANNOT_TELL),
    ([Observation("a", U, U, 1)], CANNOT_TELL),
    ([Observation("a", 0.55, 0.55, 0.8), Observation("b", 7, 7)], HONOURED),
    ([Observation("a", 0.55, 0.55, 0.8), Observation("b", 7, 9)], ALTERED),  # one sign of change is enough
    ([Observation("a", 7, 9, -1), Observation("b", 7, -1, -1)], DROPPED),  # dropped ranks before altered
    ([Observation("a", 0.8, 0.8, 0.8), Observation("b", U, 3)], CANNOT_TELL),
]


@pytest.mark.parametrize("observations,expected", MANY, ids=[str(i) for i in range(len(MANY))])
def test_a_parameters_verdict_is_the_worst_evidence(observations, expected):
    assert judge("p", 1, observations).verdict == expected


def test_from_answers_a_lossy_gateway_is_named_exactly():
    """/slots params after the canary went direct and through a gateway that dropped temperature and
    seed and rewrote max_tokens; the defaults are llama-server's (/props)."""
    defaults = {"temperature": 0.8, "top_p": 0.95, "seed": 4294967295, "n_predict": -1, "top_k": 40}
    direct = CanaryAnswer({"usage": {"completion_tokens": 7}},
                          {"temperature": 0.55, "top_p": 0.87, "seed": 4242, "n_predict": 7, "top_k": 23})
    via = CanaryAnswer({"usage": {"completion_tokens": 16}},
                       {"temperature": 0.8, "top_p": 0.87, "seed": 4294967295, "n_predict": 16, "top_k": 23})
    got = {v.param: v.verdict for v in verdicts(["temperature", "top_p", "seed", "max_tokens", "top_k",
                                                  "stop", "reasoning_effort"], direct, via, defaults)}
    assert got == {"temperature": DROPPED, "top_p": HONOURED, "seed": DROPPED, "max_tokens": ALTERED,
                   "top_k": HONOURED, "stop": CANNOT_TELL, "reasoning_effort": CANNOT_TELL}
    assert exit_code(verdicts(["temperature"], direct, via, defaults)) == 1
    assert exit_code(verdicts(["top_p", "stop"], direct, via, defaults)) == 0
