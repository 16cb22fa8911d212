"""`--workers N|auto`: the flag, its check, and a sweep's levels run by worker processes.

`sweep_with_workers` is what a command that runs sweeps (sweep, a grid's cells) wraps its
`run_sweep` in; run/workers.py does the work, analysis/merge.py the arithmetic.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from ..core.errors import ConfigError
from ..output.files import write_files
from ..output.worker_hlog import worker_hlog
from ..run.config import SweepConfig
from ..run.model import Run, RunObserver
from ..run.sweep import run_sweep
from ..run.ray_workers import LOCAL, RAY_INSTALL, RayPool, import_ray, reach_ray, ray_endpoint
from ..run.workers import WorkerPool, auto_workers, local_workers, usable_cores
from .common import die_with_parent
from .shared import checking_only

WORKERS_DIR = "workers"  # in the results folder while the run goes on: one records file per worker


class Workers(click.ParamType):
    """A number of processes, or `auto`."""

    name = "N|auto"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int | str:
        if value == "auto" or (isinstance(value, int) and value >= 1):
            return value
        try:
            n = int(value)
        except (TypeError, ValueError):
            n = 0
        if n < 1:
            self.fail(f"{value!r} is not a number of processes (1 or more) or auto", param, ctx)
        return n


def workers_option(f: Callable) -> Callable:
    f = click.option(
        "--ray", "ray_address", is_flag=False, flag_value=LOCAL, default=None, metavar="[ADDRESS]",
        help="Run the --workers as Ray actors across a Ray cluster: ADDRESS (auto: the running one), or "
             f"none for a local cluster started for the run. Needs Ray: {RAY_INSTALL}.")(f)
    return click.option(
        "--workers", type=Workers(), default=1, show_default=True,
        help="Share every level over N processes on this machine (auto: one per core, less one when a "
             "target is local), each with its own event loop and connections; the results are merged.")(f)


def resolve_workers(workers: int | str, ray_address: str | None, config: SweepConfig) -> SweepConfig:
    """The config with the processes (or Ray actors) `--workers`/`--ray` ask for, checked against the rest."""
    if ray_address is not None:
        ray_endpoint(ray_address)  # a bad address is refused before Ray is imported
        ray = import_ray()
        if not checking_only():  # a head that does not answer: one line in seconds, not Ray's minutes of retries
            reach_ray(ray_address, ray)
        n = 0 if workers == "auto" else int(workers)  # auto: one actor per CPU of the cluster
    else:
        cores = usable_cores()
        n = auto_workers([t.url for t in config.targets], cores) if workers == "auto" else int(workers)
        most = config.max_in_flight if config.open_loop else max(config.concurrency, default=None)
        asked, n = n, local_workers(n, most, cores)
        # one line says how many processes run, and (more than cores) that they share the cores
        shared = f" on {cores} core(s), which they share: expect event-loop lag" if n > cores else ""
        if n < asked:
            click.echo(f"--workers {workers}: {n} process(es){shared}, no level has more than {most} request(s) "
                       "in flight", err=True)
        elif shared:
            click.echo(f"--workers {workers}: {n} process(es){shared}", err=True)
        elif workers == "auto":
            click.echo(f"--workers auto: {n} process(es) on {cores} core(s)"
                       f"{', one left to the local server' if n == cores - 1 else ''}", err=True)
    several = n != 1 or ray_address is not None
    if several and config.parallel_targets:
        raise ConfigError("--workers shares one target's levels over processes; with --parallel-targets "
                          "run one loadgen per target instead")
    if several and config.time_scale != 1.0:
        raise ConfigError("--workers cannot run the demo's simulated time")
    return replace(config, workers=n, ray_address=ray_address)


@contextlib.asynccontextmanager
async def level_runner(config: SweepConfig, out_dir: Path, obs: RunObserver) -> AsyncIterator[WorkerPool | None]:
    """The worker processes (or Ray actors) the config asks for, for the block's duration; None for
    one process. Their histograms go to RESULTS/histograms/workers.hlog when the block ends."""
    if config.workers == 1 and config.ray_address is None:
        yield None
        return
    if config.ray_address is not None:
        obs.message(f"starting {config.workers or 'one per CPU of the cluster'} Ray actor(s) "
                    f"({'a local cluster' if config.ray_address == LOCAL else config.ray_address})")
        pool: WorkerPool = RayPool(config.workers, config.ray_address, out_dir / WORKERS_DIR)
    else:
        pool = WorkerPool(config.workers, out_dir / WORKERS_DIR, die_with_parent(signal.SIGTERM))
    async with pool:
        try:
            yield pool
        finally:
            merged = pool.merged_histograms()
            if merged:
                (out_dir / "histograms").mkdir(exist_ok=True)
                write_files([("workers.hlog", worker_hlog(merged))], out_dir / "histograms")


async def sweep_with_workers(run: Run, obs: RunObserver, out_dir: Path) -> None:
    """`run_sweep` with its levels sent by `run.config.workers` processes (one: this process)."""
    async with level_runner(run.config, out_dir, obs) as pool:
        await run_sweep(run, obs, level_runner=pool)


def check_one_target(config: SweepConfig, command: str) -> None:
    """A soak loads its targets at once, and a pool of workers serves one level at a time."""
    if (config.workers != 1 or config.ray_address is not None) and len(config.targets) > 1:
        raise ConfigError(f"{command} --workers loads one target; run one {command} per target")


def remove_worker_files(out_dir: Path) -> None:
    """After the final write every record is in the records file: the workers' own files go."""
    shutil.rmtree(out_dir / WORKERS_DIR, ignore_errors=True)
