"""The saturation rule on a table of slot counts x ladders: doubling, linear, sparse, skipping the
slot count, starting above it. The expected verdicts were written down from the simulator's
timing model before any run:

    smoke profile: b busy slots decode b * 500 / (1 + 0.25 (b - 1)) tok/s in all
    b = 1: 500, 2: 800, 3: 1000, 4: 1143, 8: 1333

so a server with S slots at concurrency c delivers T(min(c, S)) and, being a closed loop, each
request takes c / T(min(c, S)) (Little's law). The same server must get the same answer on any
ladder that contains or straddles its slot count: "at S" when the ladder pins it, "between" the two
tested levels around it when it does not, "at or below" the first level when that was already
saturated.

First on that model's figures (pure, exact), then against `loadgen sim` servers (real HTTP, real
timing, the probe's slot evidence).
"""

from __future__ import annotations

from contextlib import ExitStack

import pytest

from loadgen.analysis.saturation import LevelPoint, find_knee
from loadgen.results.reader import load_run_dict
from servers import SimProcess, sweep


def decode_tok_s(busy: int) -> float:
    return busy * 500 / (1 + 0.25 * (busy - 1))


# (slots, ladder, expected knee): ("at", c) exact; ("between", lo, hi); ("at_or_below", c); None.
TABLE = [
    (1, (1, 2, 4, 8), ("at", 1)),
    (2, (1, 2, 4, 8), ("at", 2)),
    (4, (1, 2, 4, 8), ("at", 4)),
    (8, (1, 2, 4, 8, 16), ("at", 8)),
    (3, (1, 2, 4, 8, 16), ("between", 2, 4)),  # doubling that skips the slot count
    (3, (1, 2, 3, 4, 6, 8, 12), ("at", 3)),  # linear: every step small
    (8, (1, 2, 4, 8, 12), ("at", 8)),  # a x1.5 step past the slots
    (4, (1, 4, 16), ("at", 4)),  # sparse, on the slot count
    (2, (1, 4), ("between", 1, 4)),  # sparse, straddling it
    (3, (1, 2, 4, 6, 8, 12), ("between", 2, 4)),
    (2, (4, 8, 16), ("at_or_below", 4)),  # starts above the slot count
    (8, (1, 2, 4), None),  # never reaches it
]
IDS = [f"{slots}slots-" + ",".join(map(str, ladder)) for slots, ladder, _ in TABLE]


def described(knee) -> tuple | None:
    if knee is None:
        return None
    if knee.at_or_below:
        return ("at_or_below", knee.at)
    if knee.between:
        return ("between", *knee.between)
    return ("at", knee.at)


@pytest.mark.parametrize("slots,ladder,expected", TABLE, ids=IDS)
def test_the_rule_on_the_timing_models_figures(slots, ladder, expected):
    points, full = [], set()
    for c in ladder:
        tput = decode_tok_s(min(c, slots))
        points.append(LevelPoint(c, tput, 1000 * c * 32 / tput))
        if c > slots:
            full.add(c)  # every slot busy and requests deferred
    assert described(find_knee(points, slots_full=full, total_slots=slots)) == expected


def test_a_dip_that_a_later_level_climbs_out_of_is_not_the_knee():
    """The real 4-slot test-bed server on a busy 2-core machine: c=2 gained only 4% (noise), then
    c=4 gained 35%; the knee is at the slot count, not at c=1."""
    points = [LevelPoint(1, 35.4, 903), LevelPoint(2, 37.0, 1731), LevelPoint(4, 49.9, 2562),
              LevelPoint(8, 44.2, 5428)]
    assert described(find_knee(points, slots_full={8}, total_slots=4)) == ("at", 4)


# Each server's time scale: 3 slots runs three times slower (the same ratios, a third of the figures).
# Its linear ladder steps from c=3 to c=4 (a third more), where a gain of 10% x 1/3 = 3.3% already
# reads as "still rising": at c=3 each slot idles for the client's turnaround between a response and
# the next request (at c=4 a queued request fills it), and at smoke speed (96 ms a request at 3 slots)
# that turnaround alone was 2.4% of it on a quiet machine and up to 12% at load 11 on 2 cores, so c=4
# "gained" 4% and the knee moved to 4 in 3 runs of 5. At 288 ms a request it stays under 2.5%
# (8 sweeps at load 8-11). A stall of the client itself during c=3 is not covered: once at load 10
# (a loop lag of 150 ms in the level) c=4 still gained 6% and the knee moved.
TIME_SCALE = {1: 1.0, 2: 1.0, 3: 3.0, 4: 1.0, 8: 1.0}


@pytest.fixture(scope="module")
def sims():
    """`loadgen sim` servers (smoke profile) with 1, 2, 3, 4 and 8 slots, each in its own process."""
    with ExitStack() as stack:
        yield {slots: stack.enter_context(SimProcess("--profile", "smoke", "--slots", str(slots), "--time-scale",
                                                     str(scale))).url
               for slots, scale in TIME_SCALE.items()}


@pytest.mark.parametrize("slots,ladder,expected", TABLE, ids=IDS)
def test_the_rule_against_simulated_servers(sims, tmp_path, slots, ladder, expected):
    out = tmp_path / "run"
    proc = sweep("--url", sims[slots], "--concurrency", ",".join(map(str, ladder)), "--n-predict", "32",
                 "--requests", str(max(24, 3 * max(ladder))), "--warmup", "1", "--no-histograms",
                 "--output", str(out), timeout=300)
    assert proc.returncode == 0, proc.stderr
    verdict = load_run_dict(out)["targets"][0]["verdict"]
    knee = verdict["knee"]
    got = None if knee is None else (("at_or_below", knee["at"]) if knee["at_or_below"] else
                                     ("between", *knee["between"]) if knee["between"] else ("at", knee["at"]))
    assert got == expected, "\n".join(verdict["verdict"])
    first = verdict["verdict"][0]
    if expected is not None and expected[0] == "between" and expected[1] < slots < expected[2]:
        assert f"its {slots} slots are in that range" in first
    if expected == ("at", slots):
        assert f"= its {slots} slot" in first
