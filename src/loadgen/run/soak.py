"""Soak: steady closed-loop load for hours, through errors and restarts (the figures: analysis/soak.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

from ..client.backends import make_backend
from ..client.probe import Probe, ServerInfo
from ..client.registry import make_transport
from ..client.transport import Transport
from ..core.records import LevelRun
from ..engine import EngineOptions, new_decimal_salt, new_salt, run_level
from ..modes import ModeRun, ModeTarget, prepare_targets
from ..prompts import PromptSource
from ..sweep import SweepObserver
from .exact_prompt import PromptTooShort, exact_prompts

PAUSE_AFTER_ERROR_S = 1.0  # a worker whose request failed waits this long: a down server is not hammered


async def run_soak(run: ModeRun, obs: SweepObserver, source: PromptSource, checkpoint: Callable[[], None],
                   transport_factory: Callable[[], Transport] | None = None) -> None:
    """Every reachable target at once: `concurrency` workers for `duration_s`, through errors.

    The engine never gives a target up here (a restart is ridden out, its errors counted by kind)
    and pauses a failed worker for PAUSE_AFTER_ERROR_S. `checkpoint` is called every
    `checkpoint_interval_s`, so a crash loses at most that much.
    """
    config, settings = run.base, run.settings
    concurrency, duration_s = config.concurrency[0], settings["duration_s"]
    prompt_tokens = settings.get("prompt_tokens")
    live = await prepare_targets(run, obs)

    async def soak_target(t: ModeTarget) -> None:
        generation = config.generation
        if prompt_tokens:
            try:
                bodies, note = await exact_prompts(t.target.url, source, prompt_tokens, api=config.api,
                                                   headers=config.auth_headers(), timeout_s=config.timeout_s,
                                                   insecure=config.insecure)
            except PromptTooShort as exc:
                t.error = f"{t.target.url}: --prompt-tokens: {exc}"
                return
            if note:
                obs.message(f"{t.label}: {note}")
            generation = replace(generation, prompt=bodies[0], prompts=bodies)
        backend = make_backend(config.api, generation, t.model)
        salt = new_decimal_salt if prompt_tokens else new_salt
        transport = (transport_factory() if transport_factory is not None
                     else make_transport(config.transport, t.target.url, obs.message))
        await transport.open(t.target.url, concurrency, config.timeout_s, config.auth_headers(),
                             insecure=config.insecure, close_streams=t.info.closes_streams if t.info else True)
        try:
            if config.warmup > 0:
                warm = LevelRun(target=t.label, concurrency=1)
                await run_level(warm, transport, backend, requests=config.warmup, duration_s=None,
                                options=EngineOptions(salt=salt))
                if warm.stopped_reason:
                    t.error = f"{t.target.url}: warm-up failed, {warm.stopped_reason}"
                    return
            level = LevelRun(target=t.label, concurrency=concurrency, prompt_tokens=prompt_tokens)
            t.levels.append(level)
            async with Probe(t.target.url, config.auth_headers(), insecure=config.insecure) as probe:
                sampler = asyncio.ensure_future(probe.sample_until_cancelled(
                    t.label, concurrency, t.info or ServerInfo(), settings["probe_interval_s"], level.probe_samples))
                try:
                    await run_level(level, transport, backend, requests=None, duration_s=duration_s, observer=obs,
                                    options=EngineOptions(salt=salt, give_up_after=None,
                                                          pause_after_error_s=PAUSE_AFTER_ERROR_S))
                finally:
                    sampler.cancel()
                    await asyncio.gather(sampler, return_exceptions=True)
        finally:
            await transport.close()

    async def ticker() -> None:
        while True:
            await asyncio.sleep(settings["checkpoint_interval_s"])
            checkpoint()

    ticking = asyncio.ensure_future(ticker())
    try:
        await asyncio.gather(*(soak_target(t) for t in live))
    finally:
        ticking.cancel()
        await asyncio.gather(ticking, return_exceptions=True)
