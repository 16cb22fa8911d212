"""How many workers, and which level runner: this process (run/level_runner.py's `LocalRunner`),
worker processes (parent.py's `WorkerPool`) or Ray actors (ray_actors.py's `RayPool`).

`open_level_runner` is the one place that picks; every run kind takes what it gives. The workers'
files live in RESULTS/workers/ while the run goes on.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from hdrh.histogram import HdrHistogram

from ...core.errors import ConfigError
from ...core.processes import die_with_parent, usable_cores
from ..config import SweepConfig
from ..level_runner import LevelRunner, LocalRunner
from ..state import RunObserver
from .parent import WorkerPool
from .ray_actors import RayPool
from .ray_address import LOCAL

WORKERS_DIR = "workers"  # in the results folder while the run goes on: one records file per worker
MAX_PER_CORE = 4  # more worker processes than this a core only share the same cores

# Per target and level, per metric: every worker's histogram and their sum (WorkerPool.merged_histograms).
MergedHistograms = dict[tuple[str, int | float], dict[str, tuple[list[HdrHistogram], HdrHistogram]]]


def local_workers(asked: int, most_in_flight: int | None, cores: int) -> int:
    """How many processes `--workers asked` starts on this machine: no more than the most requests a
    level has in flight (a process without one would idle), and a ConfigError past MAX_PER_CORE a core."""
    n = asked if most_in_flight is None else min(asked, max(1, most_in_flight))
    if n > MAX_PER_CORE * cores:
        raise ConfigError(f"--workers {asked}: more than {MAX_PER_CORE} processes a core ({cores} here) only "
                          "share the same cores; use --ray to load from more machines")
    return n


def auto_workers(urls: list[str], cores: int | None = None) -> int:
    """`--workers auto`: one process per core this process may use, less one when a target is on
    this machine (its server needs a core too); at least one."""
    from urllib.parse import urlsplit

    if cores is None:
        cores = usable_cores()
    local = any((urlsplit(u).hostname or "") in ("localhost", "127.0.0.1", "::1") or
                (urlsplit(u).hostname or "").startswith("127.") for u in urls)
    return max(1, cores - (1 if local else 0))


def check_one_target(config: SweepConfig, command: str) -> None:
    """A soak loads its targets at once, and a pool of workers serves one level at a time."""
    if config.several_processes and len(config.targets) > 1:
        raise ConfigError(f"{command} --workers loads one target; run one {command} per target")


@contextlib.asynccontextmanager
async def open_level_runner(config: SweepConfig, out_dir: Path, obs: RunObserver,
                            keep_histograms: Callable[[MergedHistograms], None]) -> AsyncIterator[LevelRunner]:
    """The level runner the config asks for, for the block's duration: this process, `config.workers`
    processes (none outlives loadgen, however it exits), or Ray actors. The workers' histograms, when
    there are any, go to `keep_histograms` when the block ends."""
    if not config.several_processes:
        async with LocalRunner() as local:
            yield local
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
                keep_histograms(merged)


def remove_worker_files(out_dir: Path) -> None:
    """After the final write every record is in the records file: the workers' own files go."""
    shutil.rmtree(out_dir / WORKERS_DIR, ignore_errors=True)
