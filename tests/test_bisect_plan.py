"""analysis/bisect_plan.py: the next commit to measure, or the answer, on a table worked by hand."""

from __future__ import annotations

import pytest

from loadgen.analysis.bisect_plan import BAD, FOUND, GOOD, MEASURE, RANGE, SKIP, UNDECIDED, next_step

G, B, S, U, _ = GOOD, BAD, SKIP, UNDECIDED, None


def row(n: int, **marks: str) -> list[str | None]:
    """n commits, unmeasured but for marks like c0=G, c15=B."""
    out: list[str | None] = [None] * n
    for key, verdict in marks.items():
        out[int(key[1:])] = verdict
    return out


# (verdicts, status, index to measure, candidates): expected answers written before the first run
CASES = [
    # 16 commits, only the ends known: (0 + 15) / 2 = 7.5, 7 and 8 equally near, the lower first
    (row(16, c0=G, c15=B), MEASURE, 7, ()),
    # 7 good: (7 + 15) / 2 = 11
    (row(16, c0=G, c7=G, c15=B), MEASURE, 11, ()),
    # 11 bad: (7 + 11) / 2 = 9
    (row(16, c0=G, c7=G, c11=B, c15=B), MEASURE, 9, ()),
    # 9 good: only 10 is left
    (row(16, c0=G, c7=G, c9=G, c11=B, c15=B), MEASURE, 10, ()),
    # 10 good: 11 is the first bad commit, after 4 midpoints (log2 16)
    (row(16, c0=G, c7=G, c9=G, c10=G, c11=B, c15=B), FOUND, None, (11,)),
    # 7 did not build: of 1..14, 8 is nearest 7.5 (0.5) before 6 and 9 (1.5)
    (row(16, c0=G, c7=S, c15=B), MEASURE, 8, ()),
    # 6 did not build and is never needed on the way to 11
    (row(16, c0=G, c6=S, c7=G, c9=G, c10=G, c11=B, c15=B), FOUND, None, (11,)),
    # the only commit between the last good and first bad did not build: one of 10, 11
    (row(16, c0=G, c9=G, c10=S, c11=B, c15=B), RANGE, None, (10, 11)),
    # two skipped in a row
    (row(16, c0=G, c8=G, c9=S, c10=S, c11=B, c15=B), RANGE, None, (9, 10, 11)),
    # noise left 9 undecided after its extra runs: the search stops with 8's successors up to 11
    (row(16, c0=G, c8=G, c9=U, c11=B, c15=B), UNDECIDED, None, (9, 10, 11)),
    # adjacent ends: the bad end is the first bad commit, nothing measured between
    ([G, B], FOUND, None, (1,)),
    # a good commit above the first bad one (a regression that came and went) is outside the search
    (row(16, c0=G, c5=B, c9=G, c15=B), MEASURE, 2, ()),
    # the first bad one measured bounds it, not the bad end: (3 + 5) / 2 = 4
    (row(16, c0=G, c3=G, c5=B, c15=B), MEASURE, 4, ()),
]


@pytest.mark.parametrize(("verdicts", "status", "index", "candidates"), CASES)
def test_next_step(verdicts, status, index, candidates):
    step = next_step(verdicts)
    assert (step.status, step.index, step.candidates) == (status, index, candidates)


@pytest.mark.parametrize("verdicts", [[G], [None, B], [G, None], [G, G], [B, G, B], [G, "slow", B]])
def test_ends_must_be_judged_and_verdicts_known(verdicts):
    with pytest.raises(ValueError):
        next_step(verdicts)


def test_sixteen_commits_take_log2_midpoints():
    """Simulated: the first bad commit at every position of 16 is found in at most 4 midpoints."""
    for first_bad in range(1, 16):
        verdicts: list[str | None] = row(16, c0=G, c15=B)
        measured = 0
        while (step := next_step(verdicts)).status == MEASURE:
            assert step.index is not None
            verdicts[step.index] = B if step.index >= first_bad else G
            measured += 1
        assert step.status == FOUND and step.candidates == (first_bad,)
        assert measured <= 4, (first_bad, measured)
