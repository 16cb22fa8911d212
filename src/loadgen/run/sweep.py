"""A sweep: for each target, probe it, warm it up, then run every level in turn.

A level is a concurrency (closed loop) or a request rate (open loop, on a precomputed schedule).

Wires the per-target skeleton (target_setup.py) and a level runner (level_runner.py) together; owns
no timing logic of its own. The `Run` it fills is owned by the caller, so whatever happens (Ctrl-C, a
dead server) the caller can still write every record gathered so far.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import replace

from ..analysis.aggregate import typical_latency_s
from ..analysis.slo import SloTally
from ..client.backends import make_backend
from ..client.probe import Probe
from ..core.records import LevelRun
from .engine import DEFAULT_OPTIONS
from .images import check_images
from .level_runner import LevelRunner, TargetLoad
from .lora import refuse_lora_mix
from .machine_sampling import sampled_runner
from .prompts import PromptSource
from .recording import probe_stream, stream_level
from .router import refuse_model_mix, router_timeline
from .shared_prefix import new_level_salt
from .state import Run, RunObserver, TargetRun
from .target_setup import (
    TransportFactory,
    prepare_targets,
    probe_sampling,
    refuse_given_prompts_beyond_context,
    refuse_non_llm,
    refuse_prompts_beyond_context,
    target_load,
    target_probe,
)
from .workload_prompts import refuse_shapes_beyond_context

# The levels of a target, asked for one at a time, each after the previous one finished (so a
# search can read t.levels; run/capacity.py); None: the config's levels, in order.
LevelPlan = Callable[[TargetRun], Iterable[int | float]]


def _new_level(run: Run, load: TargetLoad, key: int | float) -> LevelRun:
    config, t = run.config, load.target
    if config.open_loop:
        repeat = sum(1 for done in t.levels if done.rate == key)  # this rate's earlier runs on the target
        level = LevelRun(target=t.label, concurrency=config.max_in_flight or 0, rate=key, seed_offset=repeat,
                         prompt_tokens=config.prompt_tokens, shapes=load.shapes)
    else:
        level = LevelRun(target=t.label, concurrency=int(key), prompt_tokens=config.prompt_tokens, shapes=load.shapes)
    if config.slo is not None:  # judged as the records stream by (in simulated time for the demo)
        level.slo_tally = SloTally(config.slo)
    # --trim: the level keeps its records, whose window is known only once it ends (analysis/trim.py)
    return stream_level(level, run.sink, time_scale=config.time_scale, origin_ns=run.start_ns,
                        keep=config.trim is not None,
                        extra=[level.slo_tally.add] if level.slo_tally is not None else None)


async def _sweep_level(run: Run, load: TargetLoad, key: int | float, probe: Probe, runner: LevelRunner,
                       latency_s: float | None) -> LevelRun:
    """One level on one target: its connections opened before its clock starts (`latency_s`, the
    latency seen so far, sizes an open-loop level's), the server's counters before and after, its
    /metrics and /slots sampled during, the requests sent by the `runner` (which measures the
    client's own load), figures moved to simulated time (demo). The machine is sampled through the
    level when the runner samples it (run/machine_sampling.py's `SampledRunner`)."""
    config, t, obs = run.config, load.target, load.obs
    level = _new_level(run, load, key)
    await runner.connect_ahead(load, level, latency_s)
    if t.info and t.info.metrics_enabled:
        level.server_metrics_before = await probe.metrics()
    t.levels.append(level)
    warning = None
    try:
        samples = probe_stream(run.probe_sink, time_scale=config.time_scale, origin_ns=run.start_ns)
        async with probe_sampling(probe, t, key, config.probe_interval_s, level, samples):
            warning = await runner.run(load, level)
    finally:
        if config.time_scale != 1.0:
            level.to_simulated_time(config.time_scale, run.start_ns)
    if t.info and t.info.metrics_enabled and not level.stopped_reason:
        level.server_metrics_after = await probe.metrics()
    obs.level_done(run, t, level)
    if warning:
        obs.message(f"warning: {t.label} at {level.name}: {warning}")
    return level


async def _sweep_target(run: Run, t: TargetRun, obs: RunObserver, runner: LevelRunner,
                        transport_factory: TransportFactory | None, plan: LevelPlan | None) -> None:
    config = run.config
    async with target_load(config, t, obs, source=config.prompt_source or PromptSource(),
                           prompt_tokens=config.prompt_tokens, options=DEFAULT_OPTIONS,
                           transport_factory=transport_factory) as load:
        if load is None:
            return
        async with target_probe(config, t) as probe:
            latency_s = load.warm_latency_s
            for key in config.levels if plan is None else plan(t):
                level = await _sweep_level(run, _level_load(load), key, probe, runner, latency_s)
                latency_s = max(filter(None, (latency_s, typical_latency_s(level))), default=None)
                if level.stopped_reason:
                    t.error = f"{t.target.display}: {level.stopped_reason} at {level.name}"
                    return
                if refuse_non_llm(t, level, load.backend):
                    return


def _level_load(load: TargetLoad) -> TargetLoad:
    """A shared-prefix run's level starts cold: its prefixes get a new level salt (run/shared_prefix.py)."""
    if load.config.shared_prefix is None:
        return load
    generation = new_level_salt(load.generation)
    return replace(load, generation=generation, backend=make_backend(load.config.api, generation, load.target.model))


async def run_sweep(run: Run, obs: RunObserver, runner: LevelRunner,
                    transport_factory: TransportFactory | None = None, plan: LevelPlan | None = None) -> None:
    """Fill `run` target by target (or all at once with parallel_targets), each level's requests
    sent by `runner` (run/level_runner.py: this process, or worker processes).

    The transport is `config.transport`'s (see `client.registry.make_transport`) unless a factory is
    given; the levels are `plan`'s when one is given (a search, --stop-at-knee), else the config's. The machine's fingerprint is read
    before the first level and sampled through every level unless `config.machine.enabled` is off
    (run/machine_sampling.py).
    """
    # a router's /metrics answers only with ?model= (run/router.py): not "off"
    live = await prepare_targets(run, obs, note_metrics_off=run.config.generation.model_mix is None)
    shared = run.config.shared_prefix
    if shared is not None:  # the prefix, the salt and the request's own text: every prompt that long
        refuse_prompts_beyond_context(live, shared.total_tokens, run.config.generation.n_predict,
                                      "prompts of {n} tokens (a shared prefix, the salt and the request's own text)")
    refuse_prompts_beyond_context(live, run.config.prompt_tokens, run.config.generation.n_predict)
    await refuse_given_prompts_beyond_context(run.config, live, obs)
    await refuse_lora_mix(run.config, live)
    await refuse_model_mix(run, live)
    await check_images(run.config, live)
    if run.config.workload is not None:
        refuse_shapes_beyond_context(live, run.config.workload.draw())
    if run.config.replay is not None:
        refuse_shapes_beyond_context(live, run.config.replay.shapes)
    runner = await sampled_runner(run, live, runner, obs)
    async with router_timeline(run, live):
        if run.config.parallel_targets:
            await asyncio.gather(*(_sweep_target(run, t, obs, runner, transport_factory, plan) for t in live))
        else:
            for t in live:
                await _sweep_target(run, t, obs, runner, transport_factory, plan)
