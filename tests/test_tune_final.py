"""`loadgen tune`'s final: which finalists the screen already separates (analysis/tune_plan.py
`final_entrants`) and where each later search starts (`start_level`), on tables written down before
the code ran. Pure: no server."""

from __future__ import annotations

import math

import pytest

from loadgen.analysis.tune_plan import Screened, final_entrants, screen_bar, start_level

INF = math.inf
SEP = "below the leader's {top} beyond the 10% noise: not searched again"


def s(cell, low, upper=INF, reason=None):
    return Screened(cell, cell, low, reason, censored=upper == INF, upper=upper)


@pytest.mark.parametrize("screened, k, final, dropped", [
    # bracketed at 5 (6 failed) against a leader proven at 6: 5 x 1.1 = 5.5 < 6, separated
    ([s("a", 6, 6), s("b", 5, 5)], 2, ("a",), {"b": "screened at 5 at most, " + SEP.format(top=6)}),
    # b's failing level was inconclusive (upper 6): inside the noise of a's 6, both race
    ([s("a", 6, 6), s("b", 5, 6)], 2, ("a", "b"), {}),
    # a censored leader ("≥4") against a cell bracketed at 3: 3.3 < 4
    ([s("a", 4), s("b", 3, 3)], 2, ("a",), {"b": "screened at 3 at most, " + SEP.format(top=4)}),
    ([s("a", 8), s("b", 8)], 2, ("a", "b"), {}),  # both at the cap: a tie, raced
    ([s("a", 32, 32), s("b", 30, 30)], 2, ("a", "b"), {}),  # 30 x 1.1 = 33 >= 32: inside the noise
    ([s("a", 6, 6), s("b", 5)], 2, ("a", "b"), {}),  # b censored: no upper bound, it races
    ([s("a", None, reason="failed: exited with code 1"), s("b", 3, 3)], 2, ("b",),
     {"a": "failed: exited with code 1"}),
    ([s("a", 2, 3), s("b", 2, 3), s("c", 1, 1)], 2, ("a", "b"),
     {"c": "screened at 1, below the finalists' 2"}),  # the pick's own drop stays
    ([s("a", 7, 7), s("b", 7, 7), s("c", 4, 4)], 3, ("a", "b"),
     {"c": "screened at 4 at most, " + SEP.format(top=7)}),  # a tie of two races, the third is separated
])
def test_finalists_the_screen_separates_beyond_the_noise_are_not_searched_again(screened, k, final, dropped):
    got = final_entrants(screened, k, 0.10)
    assert (got.finalists, got.dropped) == (final, dropped)


@pytest.mark.parametrize("low, by_rate, start", [
    (None, False, None),  # no answer: the search's own start
    (0.0, False, None),  # nothing passed
    (4.0, False, 4.0),
    (2.5, True, 2.5),  # a rate starts at the rate that passed
    (0.5, False, None),
])
def test_a_later_search_starts_at_the_screens_answer(low, by_rate, start):
    assert start_level(low, by_rate) == start


@pytest.mark.parametrize("entrants, final_repeat, runs", [
    (2, 2, 2),  # finalists race: their repeats tell a lead from the noise
    (3, 3, 3),
    (1, 2, 1),  # a lone finalist: the screen settled its lead, one full search gives its capacity
    (1, 1, 1),
])
def test_a_lone_finalist_gets_one_full_search(entrants, final_repeat, runs):
    from loadgen.analysis.tune_plan import final_runs

    assert final_runs(entrants, final_repeat) == runs


# An unscreened cell's reason: the --budget only when the budget cut it, never after a Ctrl-C
# (a search stopped 254 s into a 900 s budget said "the --budget of 900 s was spent").
@pytest.mark.parametrize("interrupted, budget_s, reason, cut", [
    (False, 900.0, "not screened: the --budget of 900 s was spent", "2 cell(s) not screened"),
    (True, 900.0, "not screened: the search was interrupted (--resume screens it)", None),
    (True, None, "not screened: the search was interrupted (--resume screens it)", None),
    (False, None, "not screened yet", None),
])
def test_an_unscreened_cell_says_why(interrupted, budget_s, reason, cut):
    from loadgen.cli.tune import TuneDocument, build_tune
    from loadgen.core.griddoc import GridCell, GridDocument, GridParamEntry, GridRun

    cells = [GridCell(id="c01", name="p=1", params={"p": "1"}),  # never started
             GridCell(id="c02", name="p=2", params={"p": "2"}, runs=[GridRun(repeat=1, status="interrupted")])]
    screen = GridDocument(template="srv --port {port} -p {p}", params=[GridParamEntry("p", ["1", "2"])], repeat=1,
                          measure="capacity", measure_args=[], wait_ready_s=60, cells=cells)
    doc = TuneDocument(template=screen.template, finalists=2, final_repeat=2, screen_budget=120, stage="none",
                       budget_s=budget_s)
    built = build_tune(doc, [screen], None, interrupted)
    assert [(c.status, c.reason) for c in built.cells] == [("untried", reason)] * 2
    assert built.cut == cut


@pytest.mark.parametrize("lows, k, noise, by_rate, bar", [  # the screen's bar (written before the rule ran)
    ([], 2, 0.10, False, None),  # nothing screened yet: climb from 1
    ([8.0], 2, 0.10, False, None),  # fewer answers than --finalists: no cut to reach yet
    ([8.0, 4.0], 2, 0.10, False, 3),  # the 2nd best, 4, less the noise: 3.6, whole users down
    ([8.0, 4.0, 6.0], 2, 0.10, False, 5),  # 6 / 1.1 = 5.45
    ([8.0, None, 0.0], 2, 0.10, False, None),  # a failed cell and one below its bar are no answers
    ([8.0, 2.0], 2, 0.10, False, None),  # 2 / 1.1 = 1.8 -> 1: a bar at 1 is no bar
    ([8.0, 8.0], 2, 0.0, False, 8),  # no noise: the cut itself (a cell tied at it passes)
    ([8.0, 8.0], 1, 0.10, False, 7),  # one finalist: the leader's 8 less the noise, 7.27
    ([4.0, 2.2], 2, 0.10, True, 2.0),  # by rate: 2.2 / 1.1
    ([4.0, 1.0], 2, 0.10, True, 0.909),  # three significant digits, rounded down
])
def test_the_screen_bar_is_the_finalists_cut_so_far_less_the_noise(lows, k, noise, by_rate, bar):
    assert screen_bar(lows, k, noise, by_rate) == bar


def test_a_cell_below_the_bar_is_dropped_saying_so():
    screened = [s("a", 8, 8), s("b", 4, 4), Screened("c", "c", 0.0, None, upper=2.0, barred=3.0)]
    got = final_entrants(screened, 2, 0.10)
    assert got.dropped["c"] == ("below the screen's bar: 3 did not pass (the finalists' cut so far less the "
                                "noise), not searched further")
