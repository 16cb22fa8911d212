"""Soak: steady closed-loop load for hours, through errors and restarts (the figures: analysis/soak.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

from ..analysis.soak import SoakTally, window_seconds
from ..client.backends import make_backend
from ..core.records import LevelRun
from .engine import EngineOptions, run_level
from .model import Run, RunObserver, TargetRun
from .prompts import PromptSource
from .recording import stream_level
from .salts import new_decimal_salt, new_salt
from .setup import (
    TransportFactory,
    fit_exact_prompts,
    open_transport,
    prepare_targets,
    probe_sampling,
    refuse_prompts_beyond_context,
    target_probe,
    warm_up,
)
from .sweep import LevelRunner

# A worker whose request could not connect waits this long, so a down server is not hammered. Only
# then: an HTTP error from a live server is answered at once, and the next request follows it.
PAUSE_AFTER_CONNECT_ERROR_S = 1.0


async def run_soak(run: Run, obs: RunObserver, source: PromptSource, checkpoint: Callable[[], None],
                   transport_factory: TransportFactory | None = None, level_runner: LevelRunner | None = None) -> None:
    """Every reachable target at once: `concurrency` workers for `duration_s`, through errors.

    The engine never gives a target up here (a restart is ridden out, its errors counted by kind)
    and pauses a worker that could not connect for PAUSE_AFTER_CONNECT_ERROR_S (a failed answer is
    followed by the next request at once). `checkpoint` is called every
    `checkpoint_interval_s`, so a crash loses at most that much. With a `level_runner` (one target
    only) the requests are its (worker processes, run/workers.py).
    """
    live = await prepare_targets(run, obs)
    refuse_prompts_beyond_context(live, run.settings.get("prompt_tokens"), run.config.generation.n_predict)

    async def ticker() -> None:
        while True:
            await asyncio.sleep(run.settings["checkpoint_interval_s"])
            checkpoint()

    ticking = asyncio.ensure_future(ticker())
    try:
        await asyncio.gather(*(_soak_target(run, t, obs, source, transport_factory, level_runner) for t in live))
    finally:
        ticking.cancel()
        await asyncio.gather(ticking, return_exceptions=True)


async def _soak_target(run: Run, t: TargetRun, obs: RunObserver, source: PromptSource,
                       transport_factory: TransportFactory | None, level_runner: LevelRunner | None) -> None:
    config, settings = run.config, run.settings
    concurrency, duration_s = config.concurrency[0], settings["duration_s"]
    prompt_tokens = settings.get("prompt_tokens")
    generation = config.generation
    if prompt_tokens:
        bodies = await fit_exact_prompts(config, t, obs, source, prompt_tokens)
        if bodies is None:
            return
        generation = replace(generation, prompt=bodies[0], prompts=bodies)
    backend = make_backend(config.api, generation, t.model)
    salt = new_decimal_salt if prompt_tokens else new_salt
    transport = await open_transport(config, t, obs, concurrency, transport_factory)
    try:
        if config.warmup > 0 and await warm_up(t, transport, backend, config.warmup, EngineOptions(salt=salt)) is None:
            return
        if level_runner is None:  # worker processes open their own
            await transport.connect_ahead(concurrency)  # before the soak's clock starts
        level = LevelRun(target=t.label, concurrency=concurrency, prompt_tokens=prompt_tokens)
        if run.sink is not None:
            tally = level.tally = SoakTally(window_seconds(duration_s))
            stream_level(level, run.sink, extra=[lambda batch: tally.add(batch, level.start_ns)])
        t.levels.append(level)
        async with target_probe(config, t) as probe:
            options = EngineOptions(salt=salt, give_up_after=None,
                                    pause_after_connect_error_s=PAUSE_AFTER_CONNECT_ERROR_S)
            async with probe_sampling(probe, t, concurrency, settings["probe_interval_s"], level):
                if level_runner is None:
                    await run_level(level, transport, backend, requests=None, duration_s=duration_s, observer=obs,
                                    options=options)
                else:
                    level.remote = True
                    await level_runner.run(replace(config, duration_s=duration_s), t, level, generation, options, obs)
    finally:
        await transport.close()
