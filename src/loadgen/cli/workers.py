"""`--workers N|auto` and `--ray`: the flags and their check against the rest of the config.

Which runner sends the levels is run/workers/policy.py's; the work is run/workers/'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import click

from ..core.errors import ConfigError
from ..core.processes import usable_cores
from ..run.workers.ray_address import LOCAL, RAY_INSTALL, import_ray, ray_endpoint, reach_ray
from .shared import checking_only

if TYPE_CHECKING:
    from ..run.config import SweepConfig


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
    from ..run.workers.policy import auto_workers, local_workers

    if ray_address is not None:
        ray_endpoint(ray_address)  # a bad address is refused before Ray is imported
        ray = import_ray()
        if not checking_only():  # a head that does not answer: one line in seconds, not Ray's minutes of retries
            reach_ray(ray_address, ray)
        n = 0 if workers == "auto" else int(workers)  # auto: one actor per CPU of the cluster
    else:
        cores = usable_cores()
        n = auto_workers([t.url for t in config.targets], cores) if workers == "auto" else int(workers)
        most = config.connections_per_target or None  # None: an open loop without a cap
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
