"""`loadgen env`: the machine's fingerprint and what would spoil a measurement on it (a pre-flight check).

Reads sysfs/procfs under --sysfs/--procfs (client/machine_facts.py), the GPUs through NVML or
nvidia-smi, and with --url each server's /props; warns by analysis/env_drift.preflight_warnings.
Exit 0 whatever it finds: the warnings are advice, a sweep records the same facts either way.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click
import msgspec

from ..client.mac_facts import mac_lines, read_mac_facts
from ..client.mac_power import power_line
from ..core.errors import ConfigError
from .common import user_errors
from .help import command

if TYPE_CHECKING:
    from ..client.telemetry import TelemetryReader
    from ..run.config import MachineOptions

PROBE_CONNECTIONS = 2  # loadgen's probe scrapes /metrics and /slots beside the requests


def default_http_threads(total_slots: int | None, cores: int) -> int | None:
    """llama-server's default --threads-http: max(n_parallel + 2, hardware threads − 1)
    (shared/llama-server-api.md); valid when the server runs on the machine read."""
    return None if total_slots is None else max(total_slots + 2, cores - 1)


@command("env")
@click.option("--sysfs", "sysfs", default="/sys", show_default=True, type=click.Path(file_okay=False),
              help="Where sysfs is mounted (like node_exporter's --path.sysfs); another tree is read the same way.")
@click.option("--procfs", "procfs", default="/proc", show_default=True, type=click.Path(file_okay=False),
              help="Where procfs is mounted (--path.procfs).")
@click.option("--url", "urls", multiple=True, help="A server to read /props of (build, model, slots); repeatable.")
@click.option("--connections", type=click.IntRange(min=1), help="Connections the planned run opens (its highest "
              "concurrency): warn when the server has fewer HTTP threads (plus the probe's two).")
@click.option("--threads-http", type=click.IntRange(min=1), help="The server's --threads-http [default: "
              "llama-server's own, max(slots + 2, cores − 1) of this machine].")
@click.option("--telemetry-url", "telemetry_urls", multiple=True,
              help="A Prometheus exporter (node_exporter, DCGM exporter) of a remote server's machine to read "
                   "instead of this machine; repeatable.")
@click.option("--interval", type=click.FloatRange(min=0), default=1.0, show_default=True,
              help="Seconds between the two readings that measure steal time.")
@click.option("--format", "output_format", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="Lines for a person, or the fingerprint as JSON.")
def env_command(sysfs: str, procfs: str, urls: tuple[str, ...], connections: int | None, threads_http: int | None,
                telemetry_urls: tuple[str, ...], interval: float, output_format: str) -> None:
    """Print this machine's fingerprint (CPU, memory, kernel, power, PCIe links, GPUs, servers) and warn about
    what would spoil a measurement."""
    from ..analysis.env_drift import preflight_warnings
    from ..client.machine_facts import MachineReader, Roots
    from ..client.telemetry import TelemetryError, TelemetryReader
    from ..core.server_props import ServerProps
    from ..output.environment import fingerprint_lines
    from ..run.machine_sampling import server_props

    with user_errors():
        for name, path, default in (("--sysfs", sysfs, "/sys"), ("--procfs", procfs, "/proc")):
            if not Path(path).is_dir() and not (path == default and not sys.platform.startswith("linux")):
                raise ConfigError(f"{name} {path}: no such directory; give where that tree is mounted")
        telemetry = TelemetryReader(telemetry_urls) if telemetry_urls else None
        reader = MachineReader(Roots(Path(sysfs), Path(procfs)), telemetry=telemetry)
        server, silent = server_props(urls) if urls else (None, {})
        try:
            fp = reader.fingerprint(server=server or None)
            time.sleep(interval)
            later = reader.sample(interval)
        except TelemetryError as exc:
            raise ConfigError(f"{exc}; is the exporter running there?") from None
        threads = threads_http
        if threads is None and server:
            threads = min(filter(None, (default_http_threads(ServerProps.of(p).total_slots, fp.cpu.logical_cores)
                                        for p in server.values())), default=None)
        planned = connections + PROBE_CONNECTIONS if connections else None
        warnings = unanswered_warnings(silent, telemetry) + \
            preflight_warnings(fp, later, connections=planned, http_threads=threads)
    mac = read_mac_facts() if sys.platform == "darwin" else None
    if output_format == "json":
        mac_doc = {} if mac is None else {"mac": msgspec.to_builtins(mac)}  # a dataclass holding a Struct
        click.echo(json.dumps({"fingerprint": fp.to_dict(), "warnings": warnings, **mac_doc}, indent=2))
        return
    for line in fingerprint_lines(fp):
        click.echo(line)
    for line in mac_lines(mac) + [power_line()] if mac is not None else []:
        click.echo(line)
    note = linux_only_note(sys.platform, Path(sysfs).is_dir(), Path(procfs).is_dir())
    if note:
        click.echo(note)
    for line in warnings:
        click.echo(f"warning: {line}", err=True)


def linux_only_note(platform: str, sysfs_present: bool, procfs_present: bool) -> str | None:
    """One line when the machine readers had no /proc or /sys to read: what was read came from
    elsewhere, and the rest is Linux-only."""
    missing = [name for name, present in (("/proc", procfs_present), ("/sys", sysfs_present)) if not present]
    if not missing:
        return None
    return (f"{platform}: no {' or '.join(missing)} here; what is shown above is what could be read, and the "
            f"rest (CPU frequency and governor, RAPL power, hwmon temperatures, steal time, PCIe links) is "
            f"Linux-only")


def unanswered_warnings(silent: dict[str, str], telemetry: TelemetryReader | None) -> list[str]:
    """One line for each --url that did not answer and each --telemetry-url that is no exporter loadgen reads."""
    out = [f"the server at {url} did not answer ({why}): is the server up, and is the URL its address "
           f"(scheme, host, port)?" for url, why in silent.items()]
    return out + [f"--telemetry-url {url} exposes no node_exporter or DCGM exporter metrics loadgen reads "
                  f"(node_*, DCGM_FI_DEV_*): give the /metrics of node_exporter or dcgm-exporter on the "
                  f"server's machine" for url in (telemetry.foreign() if telemetry else [])]


def machine_options(command):
    """The flags of a run that reads the machine under it (sweep): roots, sampling interval, idle power."""
    options = [
        click.option("--sysfs", "sysfs", default="/sys", show_default=True, type=click.Path(file_okay=False),
                     help="Where sysfs is mounted, read for the environment record (node_exporter's --path.sysfs)."),
        click.option("--procfs", "procfs", default="/proc", show_default=True, type=click.Path(file_okay=False),
                     help="Where procfs is mounted (--path.procfs)."),
        click.option("--env-interval", "env_interval_s", type=click.FloatRange(min=0.01), default=1.0,
                     show_default=True, help="Seconds between samples of the machine during a level (PCIe links, "
                     "governors, power limits, clocks, energy counters)."),
        click.option("--idle-power", "idle_s", type=click.FloatRange(min=0), default=2.0, show_default=True,
                     help="Seconds of idle power measured before the first level, when the machine has an energy "
                          "counter (RAPL, NVML); 0: none, and no net J/token."),
        click.option("--telemetry-url", "telemetry_urls", multiple=True,
                     help="A Prometheus exporter of the server's machine (node_exporter, DCGM exporter) to read "
                          "instead of this machine's sysfs and NVML; repeatable (their figures are merged)."),
        click.option("--environment/--no-environment", "record_environment", default=True, show_default=True,
                     help="Record the machine's fingerprint and per-level samples in run.json."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def machine_config(sysfs: str, procfs: str, env_interval_s: float, idle_s: float, telemetry_urls: tuple[str, ...],
                   record_environment: bool) -> MachineOptions:
    from ..run.config import MachineOptions

    for name, path, default in (("--sysfs", sysfs, "/sys"), ("--procfs", procfs, "/proc")):
        # off Linux the default trees do not exist (a Mac's facts come from its own tools)
        missing_default = path == default and not sys.platform.startswith("linux")
        if record_environment and not Path(path).is_dir() and not missing_default:
            raise ConfigError(f"{name} {path}: no such directory; give where that tree is mounted")
    return MachineOptions(sysfs=sysfs, procfs=procfs, interval_s=env_interval_s, idle_s=idle_s,
                          enabled=record_environment, telemetry_urls=tuple(telemetry_urls))
