"""A sweep: for each target, probe it, warm it up, then run every level in turn.

A level is a concurrency (closed loop) or a request rate (open loop, on a precomputed schedule).

Wires the per-target setup (setup.py), backend and engine together; owns no timing logic of its
own. The `Run` it fills is owned by the caller, so whatever happens (Ctrl-C, a dead server) the
caller can still write every record gathered so far.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Protocol

from ..analysis.aggregate import of_level, typical_latency_s
from ..client.backends import Backend, GenerationParams, make_backend
from ..client.probe import Probe
from ..client.transport import Transport
from ..core.records import LevelRun
from ..core.workload import RequestShape
from .config import SweepConfig
from .dataset_answers import dataset_generation
from .engine import DEFAULT_OPTIONS, EngineOptions, run_level, run_open_level
from .looplag import ClientLoad, LoopLagSampler, bottleneck_warning
from .model import Run, RunObserver, TargetRun
from .prompts import PromptSource
from .recording import stream_level
from .salts import new_decimal_salt
from .schedule import arrival_offsets_ns, connections_ahead
from .setup import (TransportFactory, fit_exact_prompts, open_transport, prepare_targets, probe_sampling,
                    refuse_non_llm, refuse_prompts_beyond_context, target_probe, warm_up)
from .trace_prompts import trace_generation
from .workload_prompts import refuse_shapes_beyond_context, workload_generation


async def _run_one_level(config: SweepConfig, level: LevelRun, transport: Transport, backend: Backend,
                         obs: RunObserver, options: EngineOptions) -> None:
    requests, duration_s = config.budget(level.level)
    if level.rate is None:
        await run_level(level, transport, backend, requests=requests, duration_s=duration_s, observer=obs,
                        options=options, stagger_s=config.stagger_s)
    else:
        offsets = config.replay.offsets_ns if config.replay is not None else arrival_offsets_ns(
            level.rate, requests=requests, duration_s=duration_s, arrival=config.arrival,
            burstiness=config.burstiness, seed=config.arrival_seed)
        await run_open_level(level, transport, backend, offsets, max_in_flight=config.max_in_flight, observer=obs,
                             options=options)


async def _exact_generation(config: SweepConfig, t: TargetRun,
                            obs: RunObserver) -> tuple[GenerationParams, EngineOptions] | None:
    """--prompt-tokens: the prompts cut to exactly that many tokens for this target, and salts of a
    fixed token count; None (and the target's error set) when the length cannot be built."""
    assert config.prompt_tokens is not None
    bodies = await fit_exact_prompts(config, t, obs, config.prompt_source or PromptSource(), config.prompt_tokens)
    if bodies is None:
        return None
    generation = replace(config.generation, prompt=bodies[0], prompts=bodies if len(bodies) > 1 else ())
    return generation, EngineOptions(salt=new_decimal_salt)


def _new_level(config: SweepConfig, t: TargetRun, key: int | float,
               shapes: tuple[RequestShape, ...] = ()) -> LevelRun:
    if config.open_loop:
        return LevelRun(target=t.label, concurrency=config.max_in_flight or 0, rate=key,
                        prompt_tokens=config.prompt_tokens, shapes=shapes)
    return LevelRun(target=t.label, concurrency=int(key), prompt_tokens=config.prompt_tokens, shapes=shapes)


class LevelRunner(Protocol):
    """Runs a level's requests somewhere else (run/workers.py: worker processes), filling `level` as
    the engine would; returns the load of the client that ran them (None: unknown)."""

    async def run(self, config: SweepConfig, t: TargetRun, level: LevelRun, generation: GenerationParams,
                  options: EngineOptions, obs: RunObserver) -> ClientLoad | None: ...


async def _sweep_level(run: Run, t: TargetRun, key: int | float, probe: Probe, transport: Transport,
                       backend: Backend, obs: RunObserver, options: EngineOptions,
                       latency_s: float | None,
                       runner: Callable[[LevelRun], Awaitable[ClientLoad | None]] | None = None,
                       shapes: tuple[RequestShape, ...] = ()) -> LevelRun:
    """One level on one target: its connections opened before its clock starts (`latency_s`, the
    latency seen so far, sizes an open-loop level's), the server's counters before and after, its
    /metrics and /slots sampled during, the client's own load measured, figures moved to simulated
    time (demo). With a `runner` the requests are its (worker processes, which open their own
    connections ahead), and so is the client's load."""
    config = run.config
    level = stream_level(_new_level(config, t, key, shapes), run.sink, time_scale=config.time_scale, origin_ns=run.start_ns)
    if runner is None:
        await transport.connect_ahead(connections_ahead(level.concurrency, level.rate,
                                                        requests=config.budget(key)[0], latency_s=latency_s))
    if t.info and t.info.metrics_enabled:
        level.server_metrics_before = await probe.metrics()
    t.levels.append(level)
    load: ClientLoad | None = None
    try:
        async with probe_sampling(probe, t, key, config.probe_interval_s, level):
            lag = LoopLagSampler().start()
            try:
                if runner is None:
                    await _run_one_level(config, level, transport, backend, obs, options)
                else:
                    level.remote = True
                    await runner(level)
            finally:
                load = lag.stop()
                if runner is None:
                    level.loop_lag_p99_ms, level.loop_lag_max_ms = load.loop_lag_p99_ms, load.loop_lag_max_ms
                    level.client_cpu_fraction = load.client_cpu_fraction
    finally:
        if config.time_scale != 1.0:
            level.to_simulated_time(config.time_scale, run.start_ns)
    if t.info and t.info.metrics_enabled and not level.stopped_reason:
        level.server_metrics_after = await probe.metrics()
    obs.level_done(run, t, level)
    # A level where nothing completed measured no server, so it cannot say the client limited it.
    # With a runner each worker's load was judged, and named, by the runner.
    warning = None if runner or config.servers_in_process or not of_level(level).ok \
        else bottleneck_warning(load, transport.read_clock)
    if warning:
        obs.message(f"warning: {t.label} at {level.name}: {warning}")
    return level


async def _sweep_target(run: Run, t: TargetRun, obs: RunObserver, transport_factory: TransportFactory | None,
                        level_runner: LevelRunner | None = None) -> None:
    config = run.config
    generation, options = config.generation, DEFAULT_OPTIONS
    shapes = config.workload.draw() if config.workload is not None else ()
    if config.replay is not None:
        shapes = config.replay.shapes
    if config.dataset_entries:
        answered = await dataset_generation(config, t, obs, config.dataset_entries)
        if answered is None:
            return
        generation, options, shapes = answered
    elif shapes:
        shaped = await (trace_generation(config, t, obs, config.replay) if config.replay is not None
                        else workload_generation(config, t, obs, shapes))
        if shaped is None:
            return
        generation, options = shaped
    elif config.prompt_tokens:
        exact = await _exact_generation(config, t, obs)
        if exact is None:
            return
        generation, options = exact
    backend = make_backend(config.api, generation, t.model)
    # Open loop without a cap: as many connections as requests in flight (0 = no limit).
    pool = (config.max_in_flight or 0) if config.open_loop else max(config.concurrency)
    transport = await open_transport(config, t, obs, pool, transport_factory)
    try:
        async with target_probe(config, t) as probe:
            latency_s = None
            if config.warmup > 0:
                warm = await warm_up(t, transport, backend, config.warmup, options)
                if warm is None:
                    return
                latency_s = typical_latency_s(warm)
            runner = None if level_runner is None else functools.partial(
                level_runner.run, config, t, generation=generation, options=options, obs=obs)
            for key in config.levels:
                level = await _sweep_level(run, t, key, probe, transport, backend, obs, options, latency_s, runner,
                                           shapes)
                latency_s = max(filter(None, (latency_s, typical_latency_s(level))), default=None)
                if level.stopped_reason:
                    t.error = f"{t.target.display}: {level.stopped_reason} at {level.name}"
                    return
                if refuse_non_llm(t, level, backend):
                    return
    finally:
        t.read_clock = transport.read_clock
        await transport.close()


async def run_sweep(run: Run, obs: RunObserver, transport_factory: TransportFactory | None = None,
                    level_runner: LevelRunner | None = None) -> None:
    """Fill `run` target by target (or all at once with parallel_targets).

    The transport is `config.transport`'s (see `client.registry.make_transport`) unless a factory is
    given; the levels' requests are sent by `level_runner` when one is given (worker processes).
    """
    live = await prepare_targets(run, obs, note_metrics_off=True)
    refuse_prompts_beyond_context(live, run.config.prompt_tokens, run.config.generation.n_predict)
    if run.config.workload is not None:
        refuse_shapes_beyond_context(live, run.config.workload.draw())
    if run.config.replay is not None:
        refuse_shapes_beyond_context(live, run.config.replay.shapes)
    if run.config.parallel_targets:
        await asyncio.gather(*(_sweep_target(run, t, obs, transport_factory, level_runner) for t in live))
    else:
        for t in live:
            await _sweep_target(run, t, obs, transport_factory, level_runner)
