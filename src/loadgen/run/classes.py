"""A run of request classes: each class alone, then all of them against the same server at once.

Per target: every class's lengths are drawn (core/workload.py) and its prompts cut to them with the
server's own tokenizer (a `DrawnLengthSource` per class, run/workload_prompts.py), one backend per
class over one shared transport; `config.warmup` unrecorded requests of the first class; then one
level per class alone, one after another, and (two classes or more) one level per class all started
together, each at its own load (its concurrency closed loop, or its rate on a Poisson schedule
seeded by its seed) until its own request budget is spent, or, together, until the first class has
spent its budget: then the others send no more (what is in flight finishes and is recorded), so
every request of the phase ran beside the other classes. Every level carries its class and phase;
every record its class. The results writer compares the phases (analysis/interference.py).

One process only: `--workers`/`--ray` are refused at the edge (cli/sweep.py).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace

from ..analysis.slo import SloTally, parse_slo
from ..client.backends import Backend, make_backend
from ..client.transport import Transport
from ..core.records import LevelRun
from ..core.request_class import ALONE, TOGETHER, RequestClass
from ..core.workload import RequestShape
from .engine import DEFAULT_OPTIONS, EngineOptions, run_level, run_open_level
from .recording import stream_level
from .schedule import arrival_offsets_ns
from .state import Run, RunObserver, TargetRun
from .target_setup import TransportFactory, open_transport, prepare_targets, warm_up
from .workload_prompts import DrawnLengthSource, refuse_shapes_beyond_context


@dataclass(frozen=True, slots=True)
class ClassLoad:
    """One class made ready for a target: its shapes, its backend (one body per shape), its salts."""

    request_class: RequestClass
    shapes: tuple[RequestShape, ...]
    backend: Backend
    options: EngineOptions


async def _class_loads(run: Run, t: TargetRun, obs: RunObserver) -> list[ClassLoad] | None:
    loads = []
    for c in run.config.classes:  # each class: a drawn-lengths request source of its own workload
        source = DrawnLengthSource(c.workload, f"class {c.name}: prompt_tokens")
        built = await source.build(replace(run.config, workload=c.workload), t, obs, DEFAULT_OPTIONS)
        if built is None:
            return None
        generation, options, shapes = built
        loads.append(ClassLoad(c, shapes, make_backend(run.config.api, generation, t.model), options))
    return loads


def _class_level(run: Run, t: TargetRun, load: ClassLoad, phase: str) -> LevelRun:
    c = load.request_class
    level = LevelRun(target=t.label, concurrency=0 if c.rate is not None else c.concurrency, rate=c.rate,
                     shapes=load.shapes, request_class=c.name, phase=phase)
    slo = parse_slo(c.slo) if c.slo is not None else run.config.slo  # the class's (checked at the edge), else --slo
    if slo is not None:
        level.slo_tally = SloTally(slo)
    return stream_level(level, run.sink, time_scale=run.config.time_scale, origin_ns=run.start_ns,
                        extra=[level.slo_tally.add] if level.slo_tally is not None else None)


async def _send(run: Run, t: TargetRun, load: ClassLoad, level: LevelRun, transport: Transport,
                obs: RunObserver, stop: asyncio.Event | None = None) -> None:
    """A class's level at its load until its budget is spent, or (together) until `stop` is set;
    a class that spent its budget sets `stop`, so the others send no more."""
    c = load.request_class
    try:
        if c.rate is None:
            await run_level(level, transport, load.backend, requests=c.requests, duration_s=None, observer=obs,
                            options=load.options, stop=stop)
        else:
            offsets = arrival_offsets_ns(c.rate, requests=c.requests, duration_s=None, seed=c.workload.seed)
            await run_open_level(level, transport, load.backend, offsets, observer=obs, options=load.options,
                                 stop=stop)
    finally:
        if stop is not None:
            stop.set()
        if run.config.time_scale != 1.0:
            level.to_simulated_time(run.config.time_scale, run.start_ns)
    obs.level_done(run, t, level)


async def _classes_target(run: Run, t: TargetRun, obs: RunObserver, factory: TransportFactory | None) -> None:
    config = run.config
    loads = await _class_loads(run, t, obs)
    if loads is None:
        return
    transport = await open_transport(config, t, obs, config.connections_per_target, factory)
    try:
        if config.warmup > 0:
            first = loads[0]
            if await warm_up(t, transport, first.backend, config.warmup, EngineOptions(salt=first.options.salt)) is None:
                return
        for load in loads:
            obs.message(f"{t.label}: {load.request_class.name} alone ({load.request_class.load_text}, "
                        f"{load.request_class.requests} requests)")
            level = _class_level(run, t, load, ALONE)
            t.levels.append(level)
            await _send(run, t, load, level, transport, obs)
            if level.stopped_reason:
                t.error = f"{t.target.display}: {level.stopped_reason} ({load.request_class.name} alone)"
                return
        if len(loads) < 2:
            return
        obs.message(f"{t.label}: {', '.join(load.request_class.name for load in loads)} together")
        levels = [_class_level(run, t, load, TOGETHER) for load in loads]
        t.levels.extend(levels)
        stop = asyncio.Event()
        await asyncio.gather(*(_send(run, t, load, level, transport, obs, stop) for load, level in zip(loads, levels)))
        stopped = next((lv for lv in levels if lv.stopped_reason), None)
        if stopped is not None:
            t.error = f"{t.target.display}: {stopped.stopped_reason} ({stopped.request_class} together)"
    finally:
        t.read_clock = transport.read_clock
        await transport.close()


async def run_classes(run: Run, obs: RunObserver, transport_factory: TransportFactory | None = None) -> None:
    """Fill `run` with each target's class levels (see the module docstring), target by target.
    A class whose largest drawn request a target's slot cannot hold is refused before any level."""
    live = await prepare_targets(run, obs, note_metrics_off=True)
    for c in run.config.classes:
        refuse_shapes_beyond_context(live, c.workload.draw())
    for t in live:
        await _classes_target(run, t, obs, transport_factory)
