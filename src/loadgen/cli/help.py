"""How a command's `--help` reads: its options in panels by concern, and the one spelling of a flag.

The panels (target, load shape, workload, latency targets, output, scale-out, machine) are drawn by rich-click from one table,
`CONCERNS`, so every command that takes an option shows it under the same heading; an option in no
concern stays under "Options". `command` is `click.command` with those panels; it is the only place
that knows rich-click, which is imported with the command (not by `loadgen --help`).

`output_option` is the one `--output`: the results folder or file of a command. `--out`, the old
spelling of three commands, still works: hidden from help, deprecated in the docs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click
import rich_click

# Concern -> its options, in the order --help lists them. One table for every command.
CONCERNS: dict[str, tuple[str, ...]] = {
    "Target": ("--url", "--ports", "--host", "--label", "--server-url", "--api", "--model", "--api-key",
               "--transport", "--insecure", "--wait-ready", "--timeout", "--baseline-url", "--candidate-url",
               "--direct", "--via", "--server", "--param"),
    "Load shape": ("--concurrency", "--rate", "--arrival", "--burstiness", "--max-in-flight", "--arrival-seed",
                   "--requests", "--duration", "--stagger", "--warmup", "--repeat", "--parallel-targets",
                   "--checkpoint-interval", "--depths", "--time-scale", "--stop-at-knee", "--by",
                   "--max-concurrency", "--budget", "--trim"),
    "Workload": ("--prompt", "--prompt-file", "--dataset", "--dataset-field", "--dataset-samples",
                 "--dataset-seed", "--prompt-tokens", "--n-predict", "--class", "--ignore-eos", "--reasoning-effort", "--lora-mix", "--models",
                 "--temperature",
                 "--seed", "--stream",
                 "--params"),
    "Latency targets": ("--slo", "--attainment", "--noise"),
    "Output": ("--output", "--force", "--resume", "--format", "--records", "--records-format", "--histograms",
               "--probe-interval", "--knee-gain", "--knee-latency", "--prometheus-port", "--prometheus-host",
               "--prometheus-linger", "--scrape-interval", "--percentiles"),
    "Scale-out": ("--workers", "--ray"),
    # What a run reads of the machine under it, and how a run whose machine changed is judged
    # (docs/environment.md).
    "Machine": ("--sysfs", "--procfs", "--telemetry-url", "--env-interval", "--idle-power", "--environment",
                "--interval", "--connections", "--threads-http", "--allow-env-change"),
}


def _panels(f: Callable[..., Any]) -> Callable[..., Any]:
    """`f` with one rich-click option panel per concern it has options of."""
    params = getattr(f, "__click_params__", [])
    present = {opt for param in params for opt in param.opts}
    # An option derived from a settings record (cli/settings.py) names its own panel.
    declared = [(param.panel, param.opts[0]) for param in reversed(params) if getattr(param, "panel", None)]
    # Decorators apply bottom-up and rich-click lists panels in the order they were added: reversed.
    for title, options in reversed(CONCERNS.items()):
        mine = [o for o in options if o in present]
        mine += [o for panel, o in declared if panel == title and o not in mine]
        if mine:
            f = rich_click.option_panel(title, options=mine)(f)
    return f


def command(name: str | None = None, **attrs: Any) -> Callable[[Callable[..., Any]], click.Command]:
    """`click.command(name)` whose --help groups its options by concern (`CONCERNS`)."""
    def decorate(f: Callable[..., Any]) -> click.Command:
        return rich_click.command(name, **attrs)(_panels(f))
    return decorate


def _remember_out(ctx: click.Context, _param: click.Parameter, value: Any) -> None:
    if value is not None:
        ctx.meta["loadgen.out"] = value


def _output_or_out(ctx: click.Context, _param: click.Parameter, value: Any) -> Any:
    return value if value is not None else ctx.meta.get("loadgen.out")


def output_option(name: str, help: str, **attrs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`--output` into the parameter `name`, and the deprecated, hidden `--out` as another spelling."""
    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        f = click.option("--output", name, help=help, callback=_output_or_out, **attrs)(f)
        # Eager, so that it is read before --output's callback looks for it.
        # Silent: a warning on stderr would land in the output of every script still using --out.
        return click.option("--out", "out", hidden=True, expose_value=False, is_eager=True,
                            callback=_remember_out, type=attrs.get("type"))(f)
    return decorate
