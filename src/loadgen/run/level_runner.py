"""Where a level's requests are sent: one interface for one process and for many.

`LocalRunner` sends them from this process's event loop (the engine, over the target's transport);
run/workers/parent.py's `WorkerPool` shares them over worker processes, and ray_actors.py's
`RayPool` over Ray actors. Every run kind (sweep, soak) drives a level through this interface and
never asks which runner it has (as locust's LocalRunner and MasterRunner share one Runner API).
`run/workers/policy.py` opens the one the config asks for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..analysis.aggregate import of_level
from ..client.backends import Backend, GenerationParams
from ..client.transport import Transport
from ..core.records import LevelRun
from ..core.workload import RequestShape
from .config import SweepConfig
from .engine import EngineOptions, run_level, run_open_level
from .looplag import LoopLagSampler, bottleneck_warning
from .schedule import arrival_offsets_ns, connections_ahead
from .state import RunObserver, TargetRun


@dataclass(frozen=True, slots=True)
class TargetLoad:
    """What a runner needs to send a target's levels: the run's config (its budget per level), the
    target, the request body settings and the engine's options, this process's transport and
    backend for the target (opened by run/target_setup.py's `target_load`), the observer, and the
    request shapes its levels cycle through (a drawn workload or a trace; empty: one shape)."""

    config: SweepConfig
    target: TargetRun
    generation: GenerationParams
    options: EngineOptions
    transport: Transport
    backend: Backend
    obs: RunObserver
    shapes: tuple[RequestShape, ...] = ()
    warm_latency_s: float | None = None  # the warm-up's typical latency: sizes a first open-loop level


class LevelRunner(Protocol):
    """Sends a level's requests, filling `level` as the engine does (records, start and end, why it
    stopped) and its client-load figures (loop lag, client CPU). `connect_ahead` opens, before the
    level's clock starts, the connections its requests will need (`latency_s`: the latency seen so
    far, which sizes an open-loop level's). `run` returns a warning about the client having limited
    the level, for the caller to give once the level is done, or None (none, or already given)."""

    async def connect_ahead(self, load: TargetLoad, level: LevelRun, latency_s: float | None) -> None: ...

    async def run(self, load: TargetLoad, level: LevelRun) -> str | None: ...


class LocalRunner:
    """The one-process runner: the engine on this event loop, over the target's transport."""

    async def __aenter__(self) -> LocalRunner:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def connect_ahead(self, load: TargetLoad, level: LevelRun, latency_s: float | None) -> None:
        requests = load.config.budget(level.level)[0]
        await load.transport.connect_ahead(connections_ahead(level.concurrency, level.rate, requests=requests,
                                                             latency_s=latency_s))

    async def run(self, load: TargetLoad, level: LevelRun) -> str | None:
        """The level on this loop, its client load measured as it runs. A level where nothing
        completed measured no server, so it cannot say the client limited it; nor can simulated
        servers sharing this process (their work is the client's CPU)."""
        config = load.config
        lag = LoopLagSampler().start()
        try:
            await send_level(config, level, load.transport, load.backend, load.obs, load.options)
        finally:
            client = lag.stop()
            level.loop_lag_p99_ms, level.loop_lag_max_ms = client.loop_lag_p99_ms, client.loop_lag_max_ms
            level.client_cpu_fraction = client.client_cpu_fraction
        if config.servers_in_process or not of_level(level).ok:
            return None
        return bottleneck_warning(client, load.transport.read_clock)


async def send_level(config: SweepConfig, level: LevelRun, transport: Transport, backend: Backend,
                     obs: RunObserver | None, options: EngineOptions) -> None:
    """A level's requests from this loop: closed loop (`level.rate` None) at its concurrency, or
    open loop on the arrival schedule of its rate (a replay: the trace's times); the budget is `config.budget(level.level)`."""
    requests, duration_s = config.budget(level.level)
    if level.rate is None:
        await run_level(level, transport, backend, requests=requests, duration_s=duration_s, observer=obs,
                        options=options, stagger_s=config.stagger_s)
    else:
        # A trace replay sends each request at its trace time; a rate at the arrival schedule's.
        offsets = config.replay.offsets_ns if config.replay is not None else arrival_offsets_ns(
            level.rate, requests=requests, duration_s=duration_s, arrival=config.arrival,
            burstiness=config.burstiness, seed=config.arrival_seed + level.seed_offset)
        await run_open_level(level, transport, backend, offsets, max_in_flight=config.max_in_flight, observer=obs,
                             options=options)
