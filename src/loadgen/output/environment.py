"""The fingerprint as lines a person reads (`loadgen env`, the sweep's header): one fact a line."""

from __future__ import annotations

from typing import Any

from ..analysis.energy import within_idle_noise
from ..core.environment import Fingerprint, GpuFacts
from ..core.rundoc import RunDocument
from ..core.server_props import ServerProps

UNKNOWN = "unknown"  # a value the machine did not give (docs/environment.md)
IDLE_NOISE = "≤0 (within idle noise)"  # a net energy at or below zero (analysis/energy.within_idle_noise)


def shown_net(value: float | None) -> float | str | None:
    """A net energy as the tables, the report and the lines show it: the figure, or IDLE_NOISE when it is
    at or below zero (run.json keeps the figure)."""
    return IDLE_NOISE if within_idle_noise(value) else value


def _mhz(value: float | None) -> str:
    return f"{value:.0f} MHz" if value is not None else UNKNOWN


def _of(value: object, unit: str = "") -> str:
    """`value unit`, or "unknown" when the machine did not give it."""
    return UNKNOWN if value is None else f"{value}{' ' + unit if unit else ''}"


def _gen(gen: int | None, width: int | None) -> str:
    return f"Gen{_of(gen)} x{_of(width)}" if gen is not None and width is not None else f"{UNKNOWN} link"


def _gpu_line(g: GpuFacts) -> str:
    parts = [f"GPU {g.index}: {g.name}"]
    if g.driver:
        parts.append(f"driver {g.driver}")
    if g.pcie_gen is not None:
        parts.append(f"PCIe {_gen(g.pcie_gen, g.pcie_width)} (max {_gen(g.pcie_max_gen, g.pcie_max_width)})")
    if g.power_draw_w is not None or g.power_limit_w is not None:
        parts.append(f"{_of(g.power_draw_w, 'W')} of {_of(g.power_limit_w, 'W')}")
    if g.sm_clock_mhz is not None:
        parts.append(f"SM {g.sm_clock_mhz} MHz, memory {_of(g.mem_clock_mhz, 'MHz')}")
    if g.temperature_c is not None:
        parts.append(f"{g.temperature_c} °C")
    if g.memory_used_mib is not None:
        parts.append(f"{g.memory_used_mib} MiB used")
    if g.throttle_reasons:
        parts.append("held back: " + ", ".join(g.throttle_reasons))
    return ", ".join(parts) + f" [{g.source}]"


def fingerprint_lines(fp: Fingerprint) -> list[str]:
    """The fingerprint, one fact a line: software, CPU, memory, power, PCIe links, GPUs, servers."""
    s, cpu, mem = fp.sample, fp.cpu, fp.memory
    out = [f"loadgen {fp.loadgen}, Python {fp.python}",
           f"OS: {fp.os or 'unknown'}, kernel {fp.kernel or 'unknown'}",
           f"CPU: {cpu.model or UNKNOWN}, {cpu.logical_cores or UNKNOWN} logical cores"]
    if cpu.max_mhz is not None or s.governors:
        turbo = "unknown" if s.turbo is None else ("on" if s.turbo else "off")
        out.append(f"CPU frequency: governor {'/'.join(s.governors) or 'unknown'}, {_mhz(cpu.min_mhz)}–"
                   f"{_mhz(cpu.max_mhz)}, now {_mhz(s.cur_mhz_mean)} on average, turbo {turbo}")
    else:
        out.append("CPU frequency: no cpufreq (a VM, or a container that hides it)")
    out.append(f"memory: {_of(mem.total_mib, 'MiB')}, {_of(mem.available_mib, 'MiB')} available; "
               f"swap {_of(mem.swap_total_mib, 'MiB')}, {_of(s.swap_used_mib, 'MiB')} used")
    for z in s.rapl:
        limits = ", ".join(f"{k} {v:g} W" for k, v in z.limits_w.items()) or "no limits"
        out.append(f"RAPL {z.name} ({z.zone}): {limits}")
    for link in s.links:
        if link.is_accelerator:
            out.append(f"PCI {link.address} ({link.name or 'class ' + link.pci_class}): {link.describe()}")
    out += [_gpu_line(g) for g in s.gpus] or ["no GPU (neither NVML nor nvidia-smi answered)"
                                               if fp.gpu_source is None else "no GPU"]
    chips: dict[str, list[str]] = {}
    for t in s.temperatures:
        chips.setdefault(t.chip, []).append(f"{t.sensor} {t.celsius:g} °C")
    out += [f"temperatures {chip}: {', '.join(sensors)}" for chip, sensors in chips.items()]
    for label, answer in sorted((fp.server or {}).items()):
        if isinstance(answer, dict):
            props = ServerProps.of(answer)
            out.append(f"server {label}: build {_of(props.build_info)}, model {_of(props.model_path)}, "
                       f"{_of(props.total_slots)} slots of {_of(props.n_ctx)} tokens")
    return out


def _per_token(value: float | None, unit: str) -> str:
    return f"{value:.4g} {unit}" if value is not None else f"{UNKNOWN} {unit}"


def energy_lines(doc: RunDocument | dict[str, Any]) -> list[str]:
    """One line per level (a prefill's or depth's step: its size) and energy source of a run
    (analysis/energy.py's figures in run.json)."""
    out = []
    for t in RunDocument.of(doc).targets:
        for lv in t.machine_levels():
            for e in lv.energy_figures:
                shown = shown_net(e.net_j_per_token)
                net = "" if shown is None else f", net {shown if isinstance(shown, str) else _per_token(shown, 'J/token')}"
                out.append(f"energy {t.label} at level {lv.name} ({e.source}): "
                           f"{_per_token(e.j_per_token, 'J/token')}{net}, "
                           f"{_per_token(e.tokens_per_j, 'tokens/J')}, {e.mean_w:.1f} W mean")
    return out


def environment_change_lines(doc: RunDocument | dict[str, Any]) -> list[str]:
    """'warning: the machine changed during ...' for each level (or step) flagged in run.json."""
    return [f"warning: {t.label} at level {lv.name}: the machine changed during the level: {c}"
            for t in RunDocument.of(doc).targets for lv in t.machine_levels() for c in lv.environment_changed or []]


def soak_window_lines(doc: RunDocument | dict[str, Any]) -> list[str]:
    """'warning: ... soak window N: the machine changed during it' for each soak window flagged in
    run.json, saying when the drift (first against last windows) compares that window."""
    out = []
    for t in RunDocument.of(doc).targets:
        if t.soak is None:
            continue
        compared = t.soak.drift_compared()
        for n, w in t.soak.changed_windows():
            spoils = "; the drift compares this window, so it is not the server's alone" if n in compared else ""
            out += [f"warning: {t.label} soak window {n} ({w.start_s:.0f}–{w.end_s:.0f} s): the machine changed "
                    f"during it: {c}{spoils}" for c in w.environment_changed or []]
    return out
