"""Soak: steady closed-loop load for hours, through errors and restarts (the figures: analysis/soak.py)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from ..analysis.slo import SloTally
from ..analysis.soak import SoakTally, window_seconds
from ..analysis.soak_machine import SoakMachine
from ..core.records import LevelRun
from .config import SoakSettings
from .engine import EngineOptions
from .level_runner import LevelRunner
from .machine_sampling import sampled_runner
from .prompts import PromptSource
from .recording import probe_stream, stream_level
from .state import Run, RunObserver, TargetRun
from .target_setup import (
    TransportFactory,
    prepare_targets,
    probe_sampling,
    refuse_given_prompts_beyond_context,
    refuse_prompts_beyond_context,
    target_load,
    target_probe,
)

# A worker whose request could not connect waits this long, so a down server is not hammered. Only
# then: an HTTP error from a live server is answered at once, and the next request follows it.
PAUSE_AFTER_CONNECT_ERROR_S = 1.0
# The engine never gives a target up here (a restart is ridden out, its errors counted by kind).
SOAK_OPTIONS = EngineOptions(give_up_after=None, pause_after_connect_error_s=PAUSE_AFTER_CONNECT_ERROR_S)


async def run_soak(run: Run, obs: RunObserver, source: PromptSource, settings: SoakSettings, runner: LevelRunner,
                   transport_factory: TransportFactory | None = None) -> None:
    """Every reachable target at once: `concurrency` workers for `settings.duration_s`, through
    errors, each target's one level sent by `runner` (run/level_runner.py).

    The engine pauses a worker that could not connect for PAUSE_AFTER_CONNECT_ERROR_S (a failed
    answer is followed by the next request at once). Checkpoints are the session's
    (run/session.py, every `settings.checkpoint_interval_s`), so a crash loses at most that much.
    The machine is read before and sampled through the soak, as a sweep's level is, its samples folded
    per window as each closes (analysis/soak_machine.py).
    """
    live = await prepare_targets(run, obs)
    refuse_prompts_beyond_context(live, settings.prompt_tokens, run.config.generation.n_predict)
    if not settings.prompt_tokens:
        await refuse_given_prompts_beyond_context(run.config, live, obs)
    runner = await sampled_runner(run, live, runner, obs)  # the fingerprint, and the machine through the soak
    await asyncio.gather(*(_soak_target(run, t, obs, source, settings, runner, transport_factory) for t in live))


async def _soak_target(run: Run, t: TargetRun, obs: RunObserver, source: PromptSource, settings: SoakSettings,
                       runner: LevelRunner, transport_factory: TransportFactory | None) -> None:
    # The level's budget is the soak's duration: a closed loop at the one concurrency until then.
    config = replace(run.config, duration_s=settings.duration_s)
    concurrency = config.concurrency[0]
    async with target_load(config, t, obs, source=source, prompt_tokens=settings.prompt_tokens,
                           options=SOAK_OPTIONS, transport_factory=transport_factory) as load:
        if load is None:
            return
        level = LevelRun(target=t.label, concurrency=concurrency, prompt_tokens=settings.prompt_tokens)
        # The machine folded per window as each closes (a bounded number of samples, however long).
        level.environment = SoakMachine(window_seconds(settings.duration_s), lambda: (
            (level.start_ns - run.start_ns) / 1e9 if level.start_ns else None))
        await runner.connect_ahead(load, level, None)  # before the soak's clock starts
        if run.sink is not None:
            tally = level.tally = SoakTally(window_seconds(settings.duration_s), config.slo)
            extra = [lambda batch: tally.add(batch, level.start_ns)]
            if config.slo is not None:  # the level's summary judged as a sweep's level is (run.json's levels)
                level.slo_tally = SloTally(config.slo)
                extra.append(level.slo_tally.add)
            stream_level(level, run.sink, extra=extra)
        t.levels.append(level)
        async with target_probe(config, t) as probe:
            async with probe_sampling(probe, t, concurrency, settings.probe_interval_s, level,
                                      probe_stream(run.probe_sink)):
                warning = await runner.run(load, level)
        if warning:
            obs.message(f"warning: {t.label} at {level.name}: {warning}")
