"""A sweep: for each target, probe it, warm it up, then run every level in turn.

A level is a concurrency (closed loop) or a request rate (open loop, on a precomputed schedule).

Wires probe, backend, transport and engine together; owns no timing logic of its own. The
`SweepRun` it fills is owned by the caller, so whatever happens (Ctrl-C, a dead server) the caller
can still write every record gathered so far.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from .client.backends import OPENAI_APIS, Backend, GenerationParams, make_backend
from .config import SweepConfig, Target
from .core.clock import now_ns
from .engine import DEFAULT_OPTIONS, EngineOptions, Observer, new_decimal_salt, run_level, run_open_level
from .run.exact_prompt import PromptTooShort, exact_prompts
from .run.looplag import LoopLagSampler, bottleneck_warning
from .client.probe import Probe, ServerInfo, TargetUnreachable
from .prompts import PromptSource
from .core.records import LevelRun
from .schedule import arrival_offsets_ns
from .client.transport import Transport
from .client.registry import make_transport


@dataclass(slots=True)
class TargetRun:
    target: Target
    label: str
    info: ServerInfo | None = None
    levels: list[LevelRun] = field(default_factory=list)
    error: str | None = None  # why this target stopped early, for the user
    model: str | None = None  # the model name sent (OpenAI APIs)
    read_clock: str | None = None  # what its reads' times are: "kernel" or "loop" (see transport)


@dataclass(slots=True)
class SweepRun:
    config: SweepConfig
    targets: list[TargetRun] = field(default_factory=list)
    interrupted: bool = False
    start_ns: int = field(default_factory=now_ns)

    @property
    def complete(self) -> bool:
        return not self.interrupted and all(t.error is None for t in self.targets) and all(
            len(t.levels) == len(self.config.levels)
            and all(lv.finished and lv.stopped_reason is None for lv in t.levels)
            for t in self.targets)


class SweepObserver(Observer):
    def message(self, text: str) -> None: ...

    def level_done(self, run: SweepRun, target: TargetRun, level: LevelRun) -> None: ...


def resolve_labels(targets: list[TargetRun]) -> None:
    """Default labels: the server's model_alias, else host:port; disambiguated by port if equal."""
    for t in targets:
        if t.target.label:
            t.label = t.target.label
        elif t.info and t.info.props and t.info.props.get("model_alias"):
            t.label = str(t.info.props["model_alias"])
        else:
            t.label = t.target.hostport
    seen: dict[str, int] = {}
    for t in targets:
        seen[t.label] = seen.get(t.label, 0) + 1
    for t in targets:
        if seen[t.label] > 1 and not t.target.label:
            t.label = f"{t.label}@{t.target.hostport}"


async def _prepare(config: SweepConfig, t: TargetRun, obs: SweepObserver) -> None:
    async with Probe(t.target.url, config.auth_headers(), insecure=config.insecure) as probe:
        try:
            await probe.wait_ready(config.wait_ready_s,
                                   on_wait=lambda what: obs.message(f"{t.target.hostport}: waiting, server is {what}"))
        except TargetUnreachable as exc:
            t.error = f"{t.target.url}: {exc}"
            return
        t.info = await probe.server_info()
    if config.api in OPENAI_APIS:
        t.model = config.model or (t.info.models[0] if t.info.models else None)
        if t.model is None:
            obs.message(f"{t.target.hostport}: /v1/models named no model, so requests carry none "
                        "(give --model if the server needs one)")


async def _run_one_level(config: SweepConfig, level: LevelRun, transport: Transport, backend: Backend,
                         obs: SweepObserver, options: EngineOptions) -> None:
    requests, duration_s = config.budget(level.level)
    if level.rate is None:
        await run_level(level, transport, backend, requests=requests, duration_s=duration_s, observer=obs,
                        options=options)
    else:
        offsets = arrival_offsets_ns(level.rate, requests=requests, duration_s=duration_s, arrival=config.arrival,
                                     burstiness=config.burstiness, seed=config.arrival_seed)
        await run_open_level(level, transport, backend, offsets, max_in_flight=config.max_in_flight, observer=obs,
                             options=options)


async def _exact_generation(config: SweepConfig, t: TargetRun,
                            obs: SweepObserver) -> tuple[GenerationParams, EngineOptions] | None:
    """--prompt-tokens: the prompts cut to exactly that many tokens for this target, and salts of a
    fixed token count; None (and the target's error set) when the length cannot be built."""
    assert config.prompt_tokens is not None
    try:
        bodies, note = await exact_prompts(t.target.url, config.prompt_source or PromptSource(), config.prompt_tokens,
                                           api=config.api, headers=config.auth_headers(), timeout_s=config.timeout_s,
                                           insecure=config.insecure)
    except PromptTooShort as exc:
        t.error = f"{t.target.url}: --prompt-tokens: {exc}"
        return None
    if note:
        obs.message(f"{t.label}: {note}")
    generation = replace(config.generation, prompt=bodies[0], prompts=bodies if len(bodies) > 1 else ())
    return generation, EngineOptions(salt=new_decimal_salt)


async def _sweep_target(run: SweepRun, t: TargetRun, obs: SweepObserver,
                        transport_factory: Callable[[], Transport] | None) -> None:
    config = run.config
    generation, options = config.generation, DEFAULT_OPTIONS
    if config.prompt_tokens:
        exact = await _exact_generation(config, t, obs)
        if exact is None:
            return
        generation, options = exact
    backend = make_backend(config.api, generation, t.model)
    if transport_factory is not None:
        transport = transport_factory()
    else:
        transport = make_transport(config.transport, t.target.url, obs.message)
    # Open loop without a cap: as many connections as requests in flight (0 = no limit).
    pool = (config.max_in_flight or 0) if config.open_loop else max(config.concurrency)
    await transport.open(t.target.url, pool, config.timeout_s, config.auth_headers(), insecure=config.insecure,
                         close_streams=t.info.closes_streams if t.info else True)
    try:
        async with Probe(t.target.url, config.auth_headers(), insecure=config.insecure) as probe:
            if config.warmup > 0:
                warm = LevelRun(target=t.label, concurrency=1)
                await run_level(warm, transport, backend, requests=config.warmup, duration_s=None, options=options)
                if warm.stopped_reason:
                    t.error = f"{t.target.url}: warm-up failed, {warm.stopped_reason}"
                    return
            for key in config.levels:
                if config.open_loop:
                    level = LevelRun(target=t.label, concurrency=config.max_in_flight or 0, rate=key,
                                     prompt_tokens=config.prompt_tokens)
                else:
                    level = LevelRun(target=t.label, concurrency=key, prompt_tokens=config.prompt_tokens)
                if t.info and t.info.metrics_enabled:
                    level.server_metrics_before = await probe.metrics()
                t.levels.append(level)
                sampler = asyncio.ensure_future(probe.sample_until_cancelled(
                    t.label, key, t.info or ServerInfo(), config.probe_interval_s, level.probe_samples))
                lag = LoopLagSampler().start()
                try:
                    await _run_one_level(config, level, transport, backend, obs, options)
                finally:
                    load = lag.stop()
                    level.loop_lag_p99_ms, level.loop_lag_max_ms = load.loop_lag_p99_ms, load.loop_lag_max_ms
                    level.client_cpu_fraction = load.client_cpu_fraction
                    sampler.cancel()
                    await asyncio.gather(sampler, return_exceptions=True)
                    if config.time_scale != 1.0:
                        level.to_simulated_time(config.time_scale, run.start_ns)
                if t.info and t.info.metrics_enabled and not level.stopped_reason:
                    level.server_metrics_after = await probe.metrics()
                obs.level_done(run, t, level)
                warning = None if config.servers_in_process else bottleneck_warning(load, transport.read_clock)
                if warning:
                    obs.message(f"warning: {t.label} at {level.name}: {warning}")
                if level.stopped_reason:
                    t.error = f"{t.target.url}: {level.stopped_reason} at {level.name}"
                    return
    finally:
        t.read_clock = transport.read_clock
        await transport.close()


async def run_sweep(run: SweepRun, obs: SweepObserver,
                    transport_factory: Callable[[], Transport] | None = None) -> None:
    """Fill `run` target by target (or all at once with parallel_targets).

    The transport is `config.transport`'s (see `client.registry.make_transport`) unless a factory is given.
    """
    config = run.config
    run.targets = [TargetRun(target=t, label=t.label or t.hostport) for t in config.targets]
    await asyncio.gather(*(_prepare(config, t, obs) for t in run.targets))
    resolve_labels(run.targets)
    for t in run.targets:
        if t.error:
            obs.message(f"skipping {t.error}")
        elif t.info and not t.info.metrics_enabled:
            obs.message(f"{t.label}: /metrics is off or unreadable, so the deferred queue is not visible; "
                        "queuing is judged from /slots and per-request timings")
    live = [t for t in run.targets if t.error is None]
    if config.parallel_targets:
        await asyncio.gather(*(_sweep_target(run, t, obs, transport_factory) for t in live))
    else:
        for t in live:
            await _sweep_target(run, t, obs, transport_factory)
