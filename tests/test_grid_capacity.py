"""The best cell of a `grid --measure capacity` (analysis/grid_capacity.py) on tables of cases whose
answers were written before the code ran: ties, one repeat, inconclusive and open answers, failed cells."""

from __future__ import annotations

import math

import pytest

from loadgen.analysis.grid_capacity import (
    ALONE,
    BEST,
    NONE,
    TIE,
    UNTESTED,
    best_cell,
    cell_capacity,
    run_answer,
)
from loadgen.core.griddoc import CapacityEntry


def ans(feasible, fail=None, inconclusive=(), by="concurrency"):
    return CapacityEntry(by=by, feasible_max=feasible, infeasible_min=fail, inconclusive=list(inconclusive))


# one run's answer -> (low, upper, text)
RUN_ANSWERS = [
    (ans(3, 4), (3, 3, "3")),
    (ans(3, 5, [4]), (3, 4, "3–4")),  # c=4 inconclusive: between 3 and 4
    (ans(8), (8, math.inf, "≥8")),  # nothing failed up to --max-concurrency
    (ans(None, 1), (0, 0, "0")),  # not even one user
    (ans(None, None, [1]), (0, 1, "0–1")),
    (ans(2, 8), (2, 7, "2–7")),  # a budget left a gap in the bracket
    (ans(1.5, 2.0, by="rate"), (1.5, 2.0, "1.5–2")),  # rates have no next step: the failing rate bounds it
]


@pytest.mark.parametrize("entry, expected", RUN_ANSWERS)
def test_run_answer(entry, expected):
    a = run_answer(entry)
    assert (a.low, a.upper, a.text) == expected


def cell(name, *entries):
    return cell_capacity(name, list(entries))


A44 = cell("A", ans(4, 5), ans(4, 5))
B33 = cell("B", ans(3, 4), ans(3, 4))

# cells -> (kind, best, next best, tied); written before running
BEST_CASES = [
    ("clear lead with repeats", [A44, B33], (BEST, "A", "B", ())),
    ("order does not matter", [B33, A44], (BEST, "A", "B", ())),
    ("lead inside the leader's spread", [cell("A", ans(4, 5), ans(3, 4)), B33], (TIE, None, None, ("A", "B"))),
    ("equal answers", [A44, cell("B", ans(4, 5), ans(4, 5))], (TIE, None, None, ("A", "B"))),
    ("one run per cell", [cell("A", ans(4, 5)), cell("B", ans(3, 4))], (UNTESTED, "A", "B", ())),
    ("one cell with one run", [A44, cell("B", ans(3, 4))], (UNTESTED, "A", "B", ())),
    ("one run each, overlapping", [cell("A", ans(4, 5)), cell("B", ans(3, 5, [4]))], (TIE, None, None, ("A", "B"))),
    ("leader inconclusive above its floor", [cell("A", ans(4, 6, [5]), ans(4, 5)), B33], (BEST, "A", "B", ())),
    ("rival inconclusive at the leader's floor", [A44, cell("B", ans(3, 5, [4]), ans(3, 4))],
     (TIE, None, None, ("A", "B"))),
    ("rival never failed (at least 2): cannot be beaten", [A44, cell("B", ans(2), ans(2))],
     (TIE, None, None, ("A", "B"))),
    ("a failed cell is not ranked", [A44, cell("B", None, None), cell("C", ans(2, 3), ans(2, 3))],
     (BEST, "A", "C", ())),
    ("failed repeats: the cell is ranked on the rest", [cell("A", ans(4, 5), None, ans(4, 5)), B33],
     (BEST, "A", "B", ())),
    ("every cell failed", [cell("A", None), cell("B", None, None)], (NONE, None, None, ())),
    ("one cell has an answer", [cell("A", None), cell("B", ans(3, 4), ans(3, 4))], (ALONE, "B", None, ("B",))),
    ("nothing passes anywhere", [cell("A", ans(None, 1), ans(None, 1)), cell("B", ans(None, 1), ans(None, 1))],
     (TIE, None, None, ("A", "B"))),
    ("a wide rival ties, a narrow one does not", [A44, B33, cell("C", ans(2, 3), ans(5, 6))],
     (TIE, None, None, ("A", "C"))),
    ("by rate, the failing rate bounds the rival", [cell("A", ans(2.0, 2.2, by="rate"), ans(2.0, 2.2, by="rate")),
                                                    cell("B", ans(1.5, 2.0, by="rate"), ans(1.5, 2.0, by="rate"))],
     (TIE, None, None, ("A", "B"))),
    ("by rate, clear", [cell("A", ans(3.0, 3.3, by="rate"), ans(3.0, 3.3, by="rate")),
                        cell("B", ans(1.5, 2.0, by="rate"), ans(1.5, 2.0, by="rate"))], (BEST, "A", "B", ())),
]


@pytest.mark.parametrize("what, cells, expected", BEST_CASES, ids=[c[0] for c in BEST_CASES])
def test_best_cell(what, cells, expected):
    b = best_cell(cells)
    assert (b.kind, b.best, b.next_best, b.tied) == expected, b.sentence


def test_the_sentences():
    assert best_cell([A44, B33]).sentence == "A serves 4 users, the next best (B) 3 users; lead outside the noise"
    assert best_cell([cell("A", ans(4, 5), ans(3, 4)), B33]).sentence == (
        "tie: A (3.5 ± 0.71 (4, 3)), B (3 ± 0 (3, 3)); no lead outside the spread of the repeats")
    assert best_cell([cell("A", ans(2, 3)), cell("B", ans(1, 2))]).sentence == (
        "A serves 2 users, the next best (B) 1 user; untested: one run per cell, so no spread to test the lead "
        "against; use --repeat 2 or more")
    rate = [cell("A", ans(3.0, 3.3, by="rate"), ans(3.5, 3.9, by="rate")),
            cell("B", ans(1.5, 2.0, by="rate"), ans(1.5, 2.0, by="rate"))]
    assert best_cell(rate).sentence == ("A serves 3.25 req/s on average, the next best (B) 1.5 req/s; lead outside "
                                        "the noise")


# a cell's text over its repeats, written before running: a censored answer never reads as measured
@pytest.mark.parametrize("entries, text", [
    ([ans(4, 5), ans(4, 5)], "4 ± 0 (4, 4)"),
    ([ans(3, 4), ans(4, 5)], "3.5 ± 0.71 (3, 4)"),
    ([ans(4), ans(4)], "≥4 (all 2 runs)"),  # every run passed its highest level: a lower bound, not 4 ± 0
    ([ans(3, 4), ans(4)], "≥3.5 ± 0.71 (3, ≥4)"),  # one censored run makes the mean a lower bound too
    ([ans(4, 5)], "4"),
    ([], "n/a"),
])
def test_a_cells_text_says_a_lower_bound_as_one(entries, text):
    assert cell("A", *entries).text == text
