"""--slo and --attainment: latency targets, parsed and checked once at the edge (analysis/slo.py)."""

from __future__ import annotations

from collections.abc import Callable

import click

from ..analysis.slo import DEFAULT_ATTAINMENT, Slo, SloError, parse_slo
from ..core.errors import ConfigError


def slo_options(f: Callable) -> Callable:
    """--slo TARGETS and --attainment SHARE."""
    f = click.option("--attainment", type=float, default=DEFAULT_ATTAINMENT, show_default=True,
                     help="With --slo: the share of a level's requests that must meet every target for it to pass.")(f)
    return click.option("--slo", "slo_text", metavar="TARGETS",
                        help="Latency targets each request is judged against, any subset of "
                             "ttft, ttfa, tpot, itl, e2e, queue: e.g. ttft=500ms,tpot=50ms,e2e=8s. Each level then "
                             "reports its attainment and goodput; errors always miss.")(f)


def build_slo(slo_text: str | None, attainment: float, *, stream: bool, several_processes: bool = False,
              required: bool = False) -> Slo | None:
    """The run's `Slo`, or None without --slo; ConfigError (one sentence) when it cannot be judged:
    a streamed-only target without --stream (its value would be missing for every request), or
    `several_processes` (--workers or --ray: their processes keep the records the judgement needs)."""
    if slo_text is None:
        if required:
            raise ConfigError("give the latency targets with --slo, e.g. --slo ttft=500ms,tpot=50ms")
        if attainment != DEFAULT_ATTAINMENT:
            raise ConfigError("--attainment applies to --slo; give the targets too, e.g. --slo e2e=8s")
        return None
    try:
        slo = parse_slo(slo_text, attainment)
    except SloError as exc:
        raise ConfigError(str(exc)) from None
    if slo.needs_stream and not stream:
        names = ", ".join(slo.needs_stream)
        raise ConfigError(f"--slo {names} is measured on streamed responses only; add --stream "
                          f"(or judge e2e/queue instead)")
    if several_processes:
        raise ConfigError("--slo judges every request in this process; run it without --workers (or --ray)")
    return slo
