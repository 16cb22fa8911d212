"""`loadgen capacity`'s driver: a sweep whose levels a search chooses one at a time.

Each level is a normal sweep level (run/sweep.py, the same setup, warm-up, probes and records),
judged against the run's SLO as its records stream (analysis/slo.py); after it finishes, the
search (analysis/capacity_search.py) says which level comes next, or that it is done. The run's
config is kept equal to the levels run so far, in order (a repeated level appears once per run),
so run.json reads as the sweep it was and a finished search is a complete run.

It stops by itself: when the search is done, at `max_level`, or before a level that would take
the requests past `budget_requests`, or once `budget_s` seconds have passed since the first level.
It is stopped when a signal interrupts the run, when the server stops answering (a level ends as
"target down") or a level ends early for another reason: then the plan is never asked again, and
`CapacitySearch.settle` reads why from the run (`stop_reason`).

`CapacitySettings` lives with the search's rules (analysis/capacity_search.py), so a reader of a run
folder can rebuild the answer without this driver; it is named here too.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from ..analysis.aggregate import of_level
from ..analysis.capacity_search import Answer, CapacitySettings, Probe, conclude, level_name, next_probe
from ..analysis.open_loop import AT_LIMIT, OVERLOADED, judge_level
from ..core.clock import now_ns
from ..core.records import LevelRun
from .level_runner import LevelRunner
from .state import Run, RunObserver, TargetRun
from .sweep import run_sweep

# A rate level without --requests/--duration: max(40 requests, 30 s worth). At a rate a share ε
# above what the server finishes, the backlog grows by ε·rate requests a second, so over D seconds
# the last request waits about ε·D seconds longer than the first: at 30 s a 10% overload adds 3 s,
# which the open-loop verdict (analysis/open_loop.py) and a target of seconds both see, where 20 s
# of 16 requests let such a rate pass. 40 requests judge a 90% attainment on 4 allowed misses.
RATE_LEVEL_LEAST: tuple[int, float] = (40, 30.0)

__all__ = ["RATE_LEVEL_LEAST", "CapacitySearch", "CapacitySettings", "probe_of", "run_capacity", "stop_reason"]


def probe_of(level: LevelRun) -> Probe:
    """A finished level as the search reads it: judged by its streamed SLO tally and, at a rate, by
    whether the server kept up with it (analysis/open_loop.py): a level that ended overloaded or at
    its limit fails, since its queue was still growing when the level ended and a longer run at that
    rate would miss the target."""
    assert level.slo_tally is not None, "a capacity run judges every level"
    aggregate = of_level(level)
    summary = aggregate.summary(level.concurrency, rate=level.rate)
    judged = level.slo_tally.result(summary.wall_s)
    kept: str | None = None
    if level.rate is not None:
        kept = judge_level(level.level, level.rate, aggregate.sample, requests_ok=summary.requests_ok).verdict
    passed = judged.passed and kept not in (OVERLOADED, AT_LIMIT)
    return Probe(level=level.level, passed=passed, score=judged.score, ratio=dict(judged.ratio),
                 attainment=judged.attainment, open_loop=kept, judged=judged.judged, required=judged.required)


@dataclass(slots=True)
class CapacitySearch:
    """The level plan of a capacity run (one target); `history` holds every probe, `ended` why it stopped."""

    run: Run
    settings: CapacitySettings
    history: dict[int | float, list[Probe]] = field(default_factory=dict)
    order: list[int | float] = field(default_factory=list)  # the levels run, in order
    ended: str | None = None
    cut_short: bool = False  # ended by the run (a signal, the server, a level that stopped), not the plan
    requests_sent: int = 0

    def plan(self, t: TargetRun) -> Iterator[int | float]:
        s, started = self.settings, now_ns()
        while True:
            nxt = next_probe(self.history, max_level=s.max_level, repeat=s.repeat, noise=s.noise, start=s.start,
                             by_rate=s.by_rate, hold_s=s.hold_s, at_least=s.at_least)
            if nxt.level is None:
                self.ended = nxt.reason
                return
            cost = self.run.config.budget(nxt.level)[0]
            if s.budget_requests is not None and cost is not None and self.requests_sent + cost > s.budget_requests:
                self.ended = (f"budget: {self.requests_sent} requests sent, the next level would take {cost} more "
                              f"(--budget {s.budget_requests})")
                return
            if s.budget_s is not None and (now_ns() - started) / 1e9 >= s.budget_s:
                self.ended = f"budget: {s.budget_s:g} s used"
                return
            self.order.append(nxt.level)
            self._config_levels()
            yield nxt.level
            level = t.levels[-1]
            self.requests_sent += of_level(level).sent
            if level.level != nxt.level or not level.finished or level.stopped_reason:
                self.ended = f"the level stopped: {level.stopped_reason or 'not finished'}"
                return
            self.history.setdefault(nxt.level, []).append(probe_of(level))

    def settle(self, signal_name: str | None = None) -> str:
        """Why the search ended, once the run is over: the plan's own reason, or else what stopped the
        run (`stop_reason`; `signal_name`: the first signal received, e.g. "SIGINT"). Kept in `ended`."""
        if self.ended is None:
            self.cut_short = True
            t = self.run.targets[0] if self.run.targets else None
            last = t.levels[-1] if t is not None and t.levels else None
            self.ended = stop_reason(
                level_name(last.level, self.settings.by_rate) if last is not None else None,
                last.stopped_reason if last is not None else None, interrupted=self.run.interrupted,
                signal_name=signal_name, target_error=t.error if t is not None else None)
        return self.ended

    def _config_levels(self) -> None:
        """The run's config lists the levels run so far (run.json's config, `Run.complete`)."""
        if self.settings.by_rate:
            self.run.config = replace(self.run.config, rates=tuple(float(x) for x in self.order))
        else:
            self.run.config = replace(self.run.config, concurrency=tuple(int(x) for x in self.order))

    def answer(self) -> Answer:
        s = self.settings
        return conclude(self.history, s.repeat, s.noise, s.by_rate, s.hold_s)


TARGET_DOWN = "target down: "  # how run/engine.py begins a level's stop when the server stops answering


def stop_reason(level: str | None, stopped: str | None, *, interrupted: bool, signal_name: str | None = None,
                target_error: str | None = None) -> str:
    """Why a search stopped that its plan did not end, in words: interrupted (by which signal, at or
    after which level), the server stopped answering at a level, a level that ended early, or the
    target's error before any level. `level`: the last level started ("c=4"), None before the first;
    `stopped`: that level's stopped_reason."""
    if interrupted or stopped == "interrupted":
        how = {"SIGINT": " (SIGINT, Ctrl-C)", None: ""}.get(signal_name, f" ({signal_name})")
        where = " before the first level" if level is None else (f" at {level}" if stopped else f" after {level}")
        return f"interrupted{how}{where}"
    if stopped and stopped.startswith(TARGET_DOWN):
        return f"the server died or stopped answering at {level}: {stopped.removeprefix(TARGET_DOWN)}"
    if stopped:
        return f"the level at {level} stopped: {stopped}"
    if target_error:
        return f"the server could not be searched: {target_error}"
    return "stopped before the search was done"


async def run_capacity(run: Run, obs: RunObserver, search: CapacitySearch, runner: LevelRunner) -> None:
    """Fill `run` with the levels `search` chooses (one target), their requests sent by `runner`."""
    await run_sweep(run, obs, runner, plan=search.plan)
