"""`sweep --stop-at-knee`: a ladder that ends once saturation, or the SLO, is clearly past.

The config's levels in order (a run/sweep.py level plan), ending after a level when
- the saturation verdict of the levels so far (analysis/saturation.py, the rule run.json's verdict
  uses) places a knee, and that level lies above it: the knee needs one level past it to be
  placed, and a level past it is what "clearly past" means; or
- with --slo, that level failed by more than `SLO_MARGIN` (score > 1.10, analysis/slo.py) or had
  more errors than its attainment allows (an infinite score): a level just over the line might be
  noise, and a higher one may still be of interest.
The config's levels are cut to those run, so the run reads as the shorter sweep it was (and is
complete); a message says where and why it stopped.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from ..analysis.aggregate import of_level
from ..analysis.saturation import analyze_target
from .state import Run, RunObserver, TargetRun

SLO_MARGIN = 0.10


def _why_stop(run: Run, t: TargetRun) -> str | None:
    """Why the ladder stops after t's latest level, or None to go on."""
    config, last = run.config, t.levels[-1]
    summary = of_level(last).summary(last.concurrency, rate=last.rate)
    if config.slo is not None and last.slo_tally is not None:
        judged = last.slo_tally.result(summary.wall_s)
        if not judged.passed and (judged.score is None or judged.score > 1 + SLO_MARGIN):
            shown = "n/a" if judged.attainment is None else f"{judged.attainment:.0%}"
            return f"{last.name} misses the SLO clearly (attainment {shown})"
    levels = [of_level(lv).summary(lv.concurrency, rate=lv.rate).to_dict() for lv in t.levels]
    records = [r for lv in t.levels for r in of_level(lv).sample]
    samples = [s for lv in t.levels for s in lv.probe_samples]
    info = t.info
    verdict = analyze_target(t.label, levels, records, samples, info.total_slots if info else None,
                             bool(info and info.metrics_enabled), config.knee_gain, config.knee_latency,
                             config.open_loop, bool(info and info.slots_enabled))
    if verdict.knee is not None and last.level > verdict.knee.at:
        return f"saturated at {verdict.knee.at:g}, and {last.name} is past it"
    return None


def stop_at_knee(run: Run, obs: RunObserver):
    """A level plan: the config's levels, ending as the module docstring says."""
    config = run.config
    levels, rates, concurrency, open_loop = config.levels, config.rates, config.concurrency, config.open_loop

    def plan(t: TargetRun) -> Iterator[int | float]:
        for i, key in enumerate(levels):
            yield key
            if not t.levels or t.levels[-1].level != key or not t.levels[-1].finished:
                return
            reason = _why_stop(run, t) if i + 1 < len(levels) else None
            if reason:
                # `levels` is `rates` in an open loop, else `concurrency`: the one cut to those run
                if open_loop:
                    run.config = replace(run.config, rates=rates[:i + 1])
                else:
                    run.config = replace(run.config, concurrency=concurrency[:i + 1])
                obs.message(f"{t.label}: --stop-at-knee: {reason}; not running {', '.join(f'{x:g}' for x in levels[i + 1:])}")
                return

    return plan
