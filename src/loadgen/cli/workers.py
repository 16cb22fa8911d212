"""`--workers N|auto`: the flag, its check, and a sweep's levels run by worker processes.

`sweep_with_workers` is what a command that runs sweeps (sweep, a grid's cells) wraps its
`run_sweep` in; run/workers.py does the work, analysis/merge.py the arithmetic.
"""

from __future__ import annotations

import shutil
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ..core.errors import ConfigError
from ..output.files import write_files
from ..output.worker_hlog import worker_hlog
from ..run.config import SweepConfig
from ..run.model import Run, RunObserver
from ..run.sweep import run_sweep
from ..run.workers import WorkerPool, auto_workers
from .common import die_with_parent

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
    return click.option(
        "--workers", type=Workers(), default=1, show_default=True,
        help="Share every level over N processes on this machine (auto: one per core, less one when a "
             "target is local), each with its own event loop and connections; the results are merged.")(f)


def resolve_workers(workers: int | str, config: SweepConfig) -> int:
    """The number of processes `--workers` asks for, checked against the rest of the config."""
    n = auto_workers([t.url for t in config.targets]) if workers == "auto" else int(workers)
    if n > 1 and config.parallel_targets:
        raise ConfigError("--workers shares one target's levels over processes; with --parallel-targets "
                          "run one loadgen per target instead")
    if n > 1 and config.time_scale != 1.0:
        raise ConfigError("--workers cannot run the demo's simulated time")
    return n


async def sweep_with_workers(run: Run, obs: RunObserver, out_dir: Path) -> None:
    """`run_sweep` with its levels sent by `run.config.workers` processes (one: this process)."""
    if run.config.workers <= 1:
        await run_sweep(run, obs)
        return
    async with WorkerPool(run.config.workers, out_dir / WORKERS_DIR, die_with_parent(signal.SIGTERM)) as pool:
        try:
            await run_sweep(run, obs, level_runner=pool)
        finally:
            merged = pool.merged_histograms()
            if merged:
                (out_dir / "histograms").mkdir(exist_ok=True)
                write_files([("workers.hlog", worker_hlog(merged))], out_dir / "histograms")


def remove_worker_files(out_dir: Path) -> None:
    """After the final write every record is in the records file: the workers' own files go."""
    shutil.rmtree(out_dir / WORKERS_DIR, ignore_errors=True)
