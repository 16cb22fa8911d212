"""Reading the machine beside a run: its fingerprint before the first level, its idle power, and
environment samples through every level (docs/environment.md).

A level is sampled at its start, every `MachineOptions.interval_s` while it runs and at its end, beside
the probe's scrapes, so a change mid-level (the field report's PCIe downshift) is caught in the level
it spoiled; analysis/env_drift.py judges the samples and analysis/energy.py adds up their counters.
Reads happen in a thread (nvidia-smi may take a while; the event loop must not wait for it).
`server_props` reads servers' /props for `loadgen env --url`, on a loop of its own (cli runs none).
A sample's `at_s` is seconds since the run's start, on the run's clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from pathlib import Path
from typing import Any

import msgspec

from ..analysis.energy import counters_j, idle_power
from ..client.machine_facts import MachineReader, Roots
from ..client.probe import Probe, TargetUnreachable
from ..client.telemetry import TelemetryError, TelemetryReader
from ..core.clock import now_ns
from ..core.environment import EnvSample, Fingerprint
from ..core.errors import ConfigError
from ..core.records import LevelRun
from .config import MachineOptions
from .level_runner import LevelRunner, TargetLoad
from .state import Run, RunObserver, TargetRun


class MachineWatch:
    """The machine of one run: `fingerprint()` once, then `sampling(level)` around each level."""

    def __init__(self, options: MachineOptions, origin_ns: int, reader: MachineReader | None = None):
        self.options = options
        self.origin_ns = origin_ns
        telemetry = TelemetryReader(options.telemetry_urls) if options.telemetry_urls else None
        self.reader = reader or MachineReader(Roots(Path(options.sysfs), Path(options.procfs)), telemetry=telemetry)

    def _at_s(self) -> float:
        return (now_ns() - self.origin_ns) / 1e9

    async def sample(self) -> EnvSample | None:
        """A sample now; None when an exporter did not answer (that moment is left out, the run goes on)."""
        at_s = self._at_s()
        try:
            return await asyncio.to_thread(self.reader.sample, at_s)
        except TelemetryError:
            return None

    async def fingerprint(self, server: dict[str, Any] | None) -> Fingerprint:
        """The fingerprint, with the idle power measured over `idle_s` when the machine has an energy
        counter (RAPL or NVML): the baseline that net joules per token subtract."""
        try:
            fp = await asyncio.to_thread(self.reader.fingerprint, server, self._at_s())
        except TelemetryError as exc:
            raise ConfigError(f"{exc}; is the exporter running there?") from None
        if fp.mac is None:  # a Mac's sample keeps the moment its power meter started from
            fp = msgspec.structs.replace(fp, sample=msgspec.structs.replace(fp.sample, at_s=self._at_s()))
        if self.options.idle_s > 0 and counters_j(fp.sample):
            await asyncio.sleep(self.options.idle_s)
            later = await self.sample()
            if later is None:
                return fp
            fp = msgspec.structs.replace(fp, idle_power_w={k: round(v, 6) for k, v in
                                                           idle_power([fp.sample, later]).items()})
        return fp

    @asynccontextmanager
    async def sampling(self, level: LevelRun) -> AsyncIterator[None]:
        """Samples into `level.environment`: one now, one every interval while inside, one on the way out."""
        await self._add(level)
        task = asyncio.ensure_future(self._every_interval(level))
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await self._add(level)

    async def _add(self, level: LevelRun) -> None:
        sample = await self.sample()
        if sample is not None:
            level.environment.append(sample)

    async def _every_interval(self, level: LevelRun) -> None:
        while True:
            await asyncio.sleep(self.options.interval_s)
            await self._add(level)


class SampledRunner:
    """A `LevelRunner` whose every level is sampled by `watch` while the inner runner sends it: the
    one place every run kind (sweep, prefill, depth, soak) gets its per-level machine samples."""

    def __init__(self, runner: LevelRunner, watch: MachineWatch):
        self.runner, self.watch = runner, watch

    async def connect_ahead(self, load: TargetLoad, level: LevelRun, latency_s: float | None) -> None:
        await self.runner.connect_ahead(load, level, latency_s)

    async def run(self, load: TargetLoad, level: LevelRun) -> str | None:
        async with self.watch.sampling(level):
            return await self.runner.run(load, level)


async def machine_watch(run: Run, live: list[TargetRun], obs: RunObserver | None = None) -> MachineWatch | None:
    """Before the first level of any run kind: the machine's fingerprint into `run.environment` (with
    the servers' /props, and its idle power) and the watch that samples each level; None when the
    run does not read the machine (--no-environment) or no target answered. What the reader could not
    read is said once to `obs` (a Mac's powermetrics without root)."""
    if not run.config.machine.enabled or not live:
        return None
    watch = MachineWatch(run.config.machine, run.start_ns)
    run.environment = await watch.fingerprint(server_facts(live))
    for note in watch.reader.notes:
        if obs is not None:
            obs.message(f"note: {note}")
    return watch


def level_sampling(watch: MachineWatch | None, level: LevelRun) -> AbstractAsyncContextManager[None]:
    """`watch.sampling(level)`, or nothing when the run does not read the machine (a run kind that
    sends its levels itself, as `loadgen chat` does, rather than through a `LevelRunner`)."""
    return nullcontext() if watch is None else watch.sampling(level)


async def sampled_runner(run: Run, live: list[TargetRun], runner: LevelRunner,
                         obs: RunObserver | None = None) -> LevelRunner:
    """`machine_watch`, and `runner` wrapped so that each level is sampled (as it is without a watch)."""
    watch = await machine_watch(run, live, obs)
    return runner if watch is None else SampledRunner(runner, watch)


def server_props(urls: tuple[str, ...]) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """(url -> what each server's /props says of its build, model and slots, url -> why it did not
    answer at all), read one after another on an event loop of its own (`loadgen env --url` sends no load)."""
    async def read() -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
        out, silent = {}, {}
        for url in urls:
            try:
                async with Probe(url, timeout_s=5) as probe:
                    info = await probe.server_info()
            except (TargetUnreachable, OSError) as exc:
                silent[url] = str(exc)
                continue
            if info.endpoints and all(status is None for status in info.endpoints.values()):
                silent[url] = info.notes[0] if info.notes else "no answer"
            else:
                out[url] = info.props or {}
        return out, silent

    return asyncio.run(read())


def server_facts(targets: Any) -> dict[str, Any]:
    """label -> what /props said of the server's build, model and slots (the fingerprint's `server`)."""
    return {t.label: t.info.props for t in targets if t.info is not None and t.info.props}
