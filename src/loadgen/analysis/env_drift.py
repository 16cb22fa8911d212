"""Whether the machine under two runs, or under one level, was the same (pure; docs/environment.md).

Three rules, each over recorded `core.environment` records:

* `preflight_warnings(fingerprint, later)`: what spoils a measurement before it starts, one line
  each with what to do (`loadgen env`).
* `level_changes(samples)`: what changed *during* one level, between its first sample and any later
  one: an accelerator's PCIe link (generation or width), the CPU governors, turbo, a RAPL power
  limit, a GPU's power limit, a GPU clock-event reason that was absent at the start (power cap,
  thermal, hardware slowdown), or a steal share above STEAL_LIMIT over the level
  (Δsteal / Δtotal jiffies of /proc/stat's `cpu` line); on a Mac (`mac_changes`), its power source,
  Low Power Mode, its CPU speed limit (`pmset -g therm`) or a thermal warning that appeared, and
  (`mac_memory_changes`) its memory pressure rising or its swapping (swap used grown, pages swapped
  out). Such a level is flagged.
* `environment_differences(baseline, candidate)`: what differs between two sides' run documents:
  the facts in `_static_facts` (kernel, OS, CPU model and cores, governors, turbo, RAPL limits,
  memory, GPU names, drivers and power limits) and, per level, each accelerator's
  link *under load* (the lowest generation and width its samples saw: GPUs lower the link at idle,
  so only a level's samples tell); on a Mac also its kinds of cores and power state, and per level
  its Low Power Mode and lowest CPU speed limit. Differences are lines such as
  "PCIe 0000:01:00.0: baseline Gen4 x16; candidate levels 2–4: Gen3 x16" or
  "server Low Power Mode: baseline off; candidate levels 2–4: on". A server build that
  differs is a note, not a difference: comparing builds is what a gate is for; so is a flag or a
  boot decision (slots, context per slot, flash attention, --fit, offloaded layers, HTTP threads)
  of a server loadgen started (`Fingerprint.boot`, `loadgen grid`).

`compare`, `gate` and `ab` refuse (core.errors.EXIT_ENV_CHANGED) when the two sides differ, unless
--allow-env-change, and warn about every level that changed during it (not a refusal: steal on a
shared host comes and goes, and a link that dropped under load is also a difference of the links
under load); a level with a change that `spoiling` keeps (any but steal) is left out of the
comparison, unless --allow-env-change; a side without a recorded environment (a run from before it was recorded) is said, not
refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from ..core.environment import (
    EnvSample,
    Fingerprint,
    GpuFacts,
    MacPower,
    PciLink,
    fingerprint_from,
    samples_from,
)
from ..core.rundoc import RunDocument
from ..core.server_props import ServerProps

STEAL_LIMIT = 0.02  # more than 2% of the CPU time stolen by the hypervisor: another tenant competes
SWAP_GROWTH_MIB = 64  # a Mac that swapped this much more during a level paged the server (or what it competes with)
THROTTLES = ("sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake")


def steal_share(first: EnvSample | None, last: EnvSample | None) -> float | None:
    """Δsteal / Δtotal jiffies between two samples; None when either lacks them or no time passed."""
    if first is None or last is None or first.cpu_times is None or last.cpu_times is None:
        return None
    total = last.cpu_times.total_jiffies - first.cpu_times.total_jiffies
    if total <= 0:
        return None
    return max(0, last.cpu_times.steal_jiffies - first.cpu_times.steal_jiffies) / total


def _link_name(link: PciLink) -> str:
    return f"{link.name} ({link.address})" if link.name else f"PCI {link.address}"


def _gpu_link(g: GpuFacts) -> str:
    return f"PCIe Gen{g.pcie_gen} x{g.pcie_width} (max Gen{g.pcie_max_gen} x{g.pcie_max_width})"


def _gpu_below_max(g: GpuFacts) -> bool:
    return any(cur is not None and top is not None and cur < top
               for cur, top in ((g.pcie_gen, g.pcie_max_gen), (g.pcie_width, g.pcie_max_width)))


def preflight_warnings(fp: Fingerprint, later: EnvSample | None = None, *, connections: int | None = None,
                       http_threads: int | None = None) -> list[str]:
    """One line per thing that spoils a measurement, with what to do. `later`: a second sample
    (for the steal share between the two); `connections`: the planned connections (requests plus
    loadgen's probe's two), checked against the server's `http_threads`."""
    sample = later or fp.sample
    out = []
    for link in sample.links:
        if link.is_accelerator and link.below_max:
            out.append(f"{_link_name(link)} runs at {link.describe()}: GPUs lower the link at idle, so read it "
                       f"under load (a sweep records it per level); if it stays below, reseat the card or find "
                       f"what sets the link speed (BIOS, a timer).")
    linked = {link.name for link in sample.links if link.name}
    for g in sample.gpus:
        if _gpu_below_max(g) and g.name not in linked:
            out.append(f"GPU {g.index} ({g.name}) runs at {_gpu_link(g)}: read it under load; if it stays "
                       f"below, reseat the card or find what sets the link speed.")
        if g.power_limit_w and g.power_default_limit_w and g.power_limit_w < g.power_default_limit_w - 0.5:
            out.append(f"GPU {g.index} ({g.name}) is power-capped at {g.power_limit_w:g} W of its default "
                       f"{g.power_default_limit_w:g} W: `nvidia-smi -pl {g.power_default_limit_w:g}` or record it.")
        reasons = [r for r in g.throttle_reasons if r in THROTTLES]
        if reasons:
            out.append(f"GPU {g.index} ({g.name}) clocks are held back ({', '.join(reasons)}): cool it or "
                       f"lift the cap before measuring.")
        if g.processes is not None and g.processes > 1:
            out.append(f"GPU {g.index} ({g.name}) runs {g.processes} compute processes: stop the ones that "
                       f"are not the server under test.")
    not_performance = [g for g in sample.governors if g != "performance"]
    if not_performance:
        out.append(f"CPU frequency governor is {', '.join(not_performance)}, not performance: "
                   f"`cpupower frequency-set -g performance` for steadier figures.")
    for zone in sample.rapl:
        capped = [f"{k} {v:g} W of {zone.max_w[k]:g} W" for k, v in zone.limits_w.items()
                  if k in zone.max_w and v < zone.max_w[k] - 0.5]
        if capped:
            out.append(f"RAPL {zone.name} is power-capped ({'; '.join(capped)}): lift the cap (and check "
                       f"thermald does not set it back) or record it.")
    out += _mac_warnings(sample)
    if sample.swap_used_mib:
        out.append(f"{sample.swap_used_mib} MiB of swap in use: free memory (or `swapoff -a`) so the "
                   f"server's pages are not swapped under load.")
    steal = steal_share(fp.sample, later)
    if steal is not None and steal > STEAL_LIMIT:
        out.append(f"{steal:.1%} of CPU time stolen by the hypervisor: another tenant shares this host; "
                   f"measure on a dedicated one or repeat runs to see the spread.")
    if connections is not None and http_threads is not None and connections > http_threads:
        out.append(f"the server has {http_threads} HTTP threads for {connections} connections: start it with "
                   f"--threads-http {connections} or more, or open fewer connections.")
    return out


def _mac_warnings(sample: EnvSample) -> list[str]:
    """A Mac's power state that holds its chip back: Low Power Mode, a CPU speed limit, a thermal warning."""
    mac, out = sample.mac, []
    if mac is None:
        return []
    if mac.low_power_mode:
        out.append("Low Power Mode is on: the chip runs slower; `sudo pmset -a lowpowermode 0` (or System "
                   "Settings, Battery) before measuring.")
    if mac.cpu_speed_limit_pct is not None and mac.cpu_speed_limit_pct < 100:
        out.append(f"the CPU speed limit is {mac.cpu_speed_limit_pct}% (`pmset -g therm`): the Mac is throttled; "
                   f"let it cool (and check its vents) before measuring.")
    if mac.thermal_warning:
        out.append(f"thermal warning ({mac.thermal_warning}): let the Mac cool before measuring.")
    pressure = sample.mac_memory.pressure if sample.mac_memory is not None else None
    if pressure not in (None, "normal"):
        out.append(f"memory pressure is {pressure} (kern.memorystatus_vm_pressure_level): quit what else holds "
                   f"memory, so the server's pages are not compressed or swapped under load.")
    if mac.power_source == "Battery Power":
        out.append("the Mac runs on battery: macOS may lower its speed; plug it in before measuring.")
    return out


def _accelerator_links(sample: EnvSample) -> dict[str, tuple[int | None, int | None, str]]:
    """address -> (gen, width, display name) of each accelerator link in a sample (sysfs and GPUs)."""
    out = {link.address: (link.gen, link.width, _link_name(link)) for link in sample.links if link.is_accelerator}
    for g in sample.gpus:
        key = (g.bus_id or f"gpu{g.index}").lower()
        if not any(key.endswith(addr.lower().split(":", 1)[-1]) for addr in out):
            out[key] = (g.pcie_gen, g.pcie_width, f"GPU {g.index} ({g.name})")
    return out


def _gen_width(gen: int | None, width: int | None) -> str:
    return f"Gen{gen if gen is not None else '?'} x{width if width is not None else '?'}"


def level_changes(samples: Sequence[EnvSample], steal_limit: float = STEAL_LIMIT) -> list[str]:
    """What changed during one level (its samples in time order); [] when nothing did."""
    if len(samples) < 2:
        return []
    first, out = samples[0], list[str]()
    start_links = _accelerator_links(first)
    for s in samples[1:]:
        for addr, (gen, width, name) in _accelerator_links(s).items():
            if addr in start_links and start_links[addr][:2] != (gen, width):
                line = f"{name}: PCIe {_gen_width(*start_links[addr][:2])} → {_gen_width(gen, width)} at {s.at_s:.1f} s"
                if line.split(" at ")[0] not in {o.split(" at ")[0] for o in out}:
                    out.append(line)
    last = samples[-1]
    if last.governors != first.governors and first.governors:
        out.append(f"CPU governor {'/'.join(first.governors)} → {'/'.join(last.governors) or '?'}")
    if first.turbo is not None and last.turbo is not None and first.turbo != last.turbo:
        out.append(f"turbo {'on' if first.turbo else 'off'} → {'on' if last.turbo else 'off'}")
    before = {z.zone: z.limits_w for z in first.rapl}
    for z in last.rapl:
        if z.zone in before and before[z.zone] != z.limits_w:
            out.append(f"RAPL {z.name} limits {_limits(before[z.zone])} → {_limits(z.limits_w)}")
    gpus_before = {g.index: g for g in first.gpus}
    appeared: dict[int, set[str]] = {}
    for s in samples[1:]:
        for g in s.gpus:
            start = gpus_before.get(g.index)
            if start is None:
                continue
            if start.power_limit_w != g.power_limit_w and f"GPU {g.index} power limit" not in " ".join(out):
                out.append(f"GPU {g.index} power limit {start.power_limit_w} W → {g.power_limit_w} W")
            new = {r for r in g.throttle_reasons if r in THROTTLES} - set(start.throttle_reasons)
            appeared.setdefault(g.index, set()).update(new)
    for index, reasons in sorted(appeared.items()):
        if reasons:
            out.append(f"GPU {index} clock-event reasons appeared: {', '.join(sorted(reasons))}")
    out += mac_changes(samples) + mac_memory_changes(samples)
    steal = steal_share(first, last)
    if steal is not None and steal > steal_limit:
        out.append(f"{STEAL_CHANGE}{steal:.1%} of CPU time (limit {steal_limit:.0%})")
    return out


def mac_changes(samples: Sequence[EnvSample]) -> list[str]:
    """What changed of a Mac's power and thermal state during one level (pmset, `EnvSample.mac`): its
    power source, Low Power Mode switched on or off, a CPU speed limit that fell (or rose) from the
    level's start, a thermal warning that appeared. Each is said once, at the first sample that shows it."""
    states = [(s.at_s, s.mac) for s in samples if s.mac is not None]
    if len(states) < 2:
        return []
    start, out = states[0][1], dict[str, str]()
    for at_s, now in states[1:]:
        for name, before, after in _mac_facts_of(start, now):
            if before is not None and after is not None and before != after and name not in out:
                out[name] = f"{name} {before} → {after} at {at_s:.1f} s"
        if now.thermal_warning and not start.thermal_warning and "thermal warning" not in out:
            out["thermal warning"] = f"thermal warning at {at_s:.1f} s: {now.thermal_warning}"
    return list(out.values())


def mac_memory_changes(samples: Sequence[EnvSample], growth_mib: float = SWAP_GROWTH_MIB) -> list[str]:
    """What a Mac's memory did during one level (`EnvSample.mac_memory`, Mac samples only): its pressure
    level rising above the level's start (a fall is not flagged), and swapping: swap used grown by
    `growth_mib` or more, or that much swapped out (vm_stat's Swapouts) even with swap used steady
    (pages out and back in). Each is said once, at the first sample that shows it."""
    mem = [s for s in samples if s.mac_memory is not None]
    if len(mem) < 2:
        return []
    start, pressure, swap = mem[0], None, None
    first = start.mac_memory
    assert first is not None
    for s in mem[1:]:
        now = s.mac_memory
        assert now is not None
        if (pressure is None and first.pressure_level is not None and now.pressure_level is not None
                and now.pressure_level > first.pressure_level):
            pressure = f"memory pressure {first.pressure} → {now.pressure} at {s.at_s:.1f} s"
        grew = _delta(start.swap_used_mib, s.swap_used_mib)
        swapped = _delta(first.swapped_out_mib, now.swapped_out_mib)
        if swap is None and max(grew or 0, swapped or 0) >= growth_mib:
            parts = ([f"swap used {start.swap_used_mib} → {s.swap_used_mib} MiB"] if grew is not None else []) + \
                    ([f"{swapped:g} MiB swapped out"] if swapped is not None else [])
            swap = f"swapping at {s.at_s:.1f} s: {', '.join(parts)}"
    return [line for line in (pressure, swap) if line is not None]


def _delta(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else round(after - before, 1)


def _mac_facts_of(start: MacPower, now: MacPower) -> list[tuple[str, str | None, str | None]]:
    """(name, at the start, now) of the Mac states `mac_changes` follows, as their lines say them."""
    def limit(pct: int | None) -> str | None:
        return None if pct is None else f"{pct}%"

    def mode(on: bool | None) -> str | None:
        return None if on is None else ("on" if on else "off")
    return [("power source", start.power_source, now.power_source),
            ("Low Power Mode", mode(start.low_power_mode), mode(now.low_power_mode)),
            ("CPU speed limit", limit(start.cpu_speed_limit_pct), limit(now.cpu_speed_limit_pct))]


STEAL_CHANGE = "steal "  # how level_changes' steal line starts


def spoiling(changes: Iterable[str]) -> list[str]:
    """The changes of a level that spoil its figures for a verdict: all but steal, which comes and goes
    on a shared host and is only a warning."""
    return [c for c in changes if not c.startswith(STEAL_CHANGE)]


def _limits(limits: Mapping[str, float]) -> str:
    return ", ".join(f"{k} {v:g} W" for k, v in limits.items()) or "none"


def _static_facts(fp: Fingerprint) -> dict[str, Any]:
    """The facts of a fingerprint that decide a measurement and should not differ between sides."""
    s = fp.sample
    facts: dict[str, Any] = {
        "kernel": fp.kernel, "OS": fp.os, "CPU": fp.cpu.model, "logical cores": fp.cpu.logical_cores,
        "CPU governor": "/".join(s.governors) or None, "turbo": s.turbo,
        "memory (MiB)": fp.memory.total_mib,
    }
    for z in s.rapl:
        facts[f"RAPL {z.name} limits"] = _limits(z.limits_w)
    for g in s.gpus:
        facts[f"GPU {g.index}"] = g.name
        facts[f"GPU {g.index} driver"] = g.driver
        facts[f"GPU {g.index} power limit (W)"] = g.power_limit_w
    return facts | _mac_static_facts(fp)


def _mac_static_facts(fp: Fingerprint) -> dict[str, Any]:
    """A Mac's facts beside the chip (`cpu`), memory and macOS (`os`): its kinds of cores and its power
    and thermal state before the first level; none for another machine."""
    if fp.mac is None:
        return {}
    facts: dict[str, Any] = {"performance cores": fp.mac.performance_cores, "efficiency cores": fp.mac.efficiency_cores,
                             "GPU cores": fp.mac.gpu_cores}
    power = fp.sample.mac
    if power is not None:
        facts |= {"power source": power.power_source, "Low Power Mode": power.low_power_mode,
                  "CPU speed limit (%)": power.cpu_speed_limit_pct,
                  "thermal warning": power.thermal_warning or "none recorded"}
    return facts


def _server_builds(fp: Fingerprint | None) -> dict[str, Any]:
    """label -> the server's build (/props build_info): what a comparison often compares, so a
    difference is said, never refused."""
    return {label: ServerProps.of(props).build_info for label, props in sorted(((fp.server if fp else None) or {}).items())
            if isinstance(props, Mapping)}


_BOOT_NAMES = {"flags": "flags", "n_slots": "slots", "n_ctx_slot": "context per slot", "kv_unified": "unified KV cache",
               "flash_attn": "flash attention", "fit": "--fit", "offloaded_layers": "offloaded layers",
               "http_threads": "HTTP threads"}  # the build is the /props note's


def _boot_notes(base: Fingerprint | None, cand: Fingerprint | None) -> list[str]:
    """A note per boot decision (or the flags) of a server loadgen started that differs between the
    sides' first runs: said, never refused (a grid's cells differ in exactly these)."""
    base_boot, cand_boot = ((fp.boot or {}) if fp else {} for fp in (base, cand))
    out = []
    for label in sorted(base_boot.keys() & cand_boot.keys()):
        for field, name in _BOOT_NAMES.items():
            a, b = getattr(base_boot[label], field), getattr(cand_boot[label], field)
            if a != b:
                shown = [f"`{' '.join(v)}`" if field == "flags" else _show(v) for v in (a, b)]
                out.append(f"{label}: server {name} {shown[0]} in the baseline, {shown[1]} in the candidate")
    return out


def _level_links(doc: RunDocument) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """(target, accelerator) -> [(level name, "GenG xW" under load)] over a run's levels: per level
    the lowest generation and width its samples saw."""
    out: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for t in doc.targets:
        for lv in t.machine_levels():
            seen: dict[str, tuple[list[int], list[int], str]] = {}
            for s in samples_from(lv.environment):
                for addr, (gen, width, name) in _accelerator_links(s).items():
                    gens, widths, _ = seen.setdefault(addr, ([], [], name))
                    gens += [gen] if gen is not None else []
                    widths += [width] if width is not None else []
            for gens, widths, name in seen.values():
                out.setdefault((t.label, name), []).append(
                    (lv.name, _gen_width(min(gens, default=None), min(widths, default=None))))
    return out


def _levels_text(levels: Sequence[str]) -> str:
    if len(levels) == 1:
        return f"level {levels[0]}"
    return f"levels {levels[0]}–{levels[-1]}" if len(levels) > 2 else f"levels {levels[0]}, {levels[1]}"


def _level_mac(doc: RunDocument) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """(target, Mac state) -> [(level name, its value under that level)] over a run's levels: Low Power
    Mode "on" if any sample of the level had it on, the lowest CPU speed limit a sample saw."""
    out: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for t in doc.targets:
        for lv in t.machine_levels():
            states = [s.mac for s in samples_from(lv.environment) if s.mac is not None]
            modes = [m.low_power_mode for m in states if m.low_power_mode is not None]
            limits = [m.cpu_speed_limit_pct for m in states if m.cpu_speed_limit_pct is not None]
            if modes:
                out.setdefault((t.label, "Low Power Mode"), []).append((lv.name, "on" if any(modes) else "off"))
            if limits:
                out.setdefault((t.label, "CPU speed limit"), []).append((lv.name, f"{min(limits)}%"))
    return out


def _level_differences(base: dict[tuple[str, str], list[tuple[str, str]]],
                       cand: dict[tuple[str, str], list[tuple[str, str]]], what: str = "") -> list[str]:
    """A line per (target, thing) whose value under some candidate levels is not the baseline's usual
    one (the value most of its levels had)."""
    out = []
    for (target, device), base_levels in sorted(base.items()):
        usual = max({v for _, v in base_levels}, key=lambda v: [x for _, x in base_levels].count(v))
        differ_levels = [lv for lv, v in cand.get((target, device), []) if v != usual]
        if differ_levels:
            seen = {v for lv, v in cand[(target, device)] if lv in differ_levels}
            out.append(f"{target} {device}: baseline {what}{usual}; candidate {_levels_text(differ_levels)}: "
                       f"{what}{', '.join(sorted(seen))}")
    return out


@dataclass
class _Side:
    """One side of a comparison as the drift guard reads it: its runs and their recorded machines."""

    name: str
    docs: list[RunDocument]

    @cached_property
    def fingerprints(self) -> list[Fingerprint | None]:
        return [fingerprint_from(d.environment) for d in self.docs]

    @property
    def recorded(self) -> bool:
        """Every run of the side recorded its machine (a side without runs did not)."""
        return bool(self.docs) and all(fp is not None for fp in self.fingerprints)

    @cached_property
    def facts(self) -> list[dict[str, Any]]:
        """Each run's static facts (`_static_facts`), the side's first run first."""
        return [_static_facts(fp) for fp in self.fingerprints if fp is not None]

    @cached_property
    def links(self) -> dict[tuple[str, str], list[tuple[str, str]]]:
        """The first run's accelerator links per level (`_level_links`)."""
        return _level_links(self.docs[0])

    @cached_property
    def mac_levels(self) -> dict[tuple[str, str], list[tuple[str, str]]]:
        """The first run's Mac power states per level (`_level_mac`)."""
        return _level_mac(self.docs[0])


def _why_unrecorded(side: _Side) -> str:
    """Why a side's first run without a fingerprint has none, as its config tells: turned off, a chat run
    (`loadgen chat` recorded none before it sampled the machine as a sweep does), else an older loadgen."""
    doc = next((d for d, fp in zip(side.docs, side.fingerprints) if fp is None), None)
    config = doc.config if doc is not None else None
    if config is not None and not config.environment:
        return "recorded with --no-environment"
    mode = config.cache_mode if config is not None else None
    if mode is not None and mode.kind == "multi_turn":
        return "a loadgen chat run from before chat recorded it"
    return "a run from before loadgen recorded it"


def environment_differences(baseline: Iterable[RunDocument | dict[str, Any]],
                            candidate: Iterable[RunDocument | dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(differences, notes) between two sides' run documents (each side one or more runs).

    A difference is a line naming the fact and both values; notes say what could not be compared
    (a side without a recorded environment, when the other has one; neither: nothing is said; a fact
    unknown to any run of either side is "not compared", a note when another run knows it, never a difference). Runs within one side are compared against the side's
    first run too, so a folder of runs taken across a change is caught."""
    base, cand = (_Side(name, [RunDocument.of(d) for d in docs])
                  for name, docs in (("baseline", baseline), ("candidate", candidate)))
    if not any(fp is not None for side in (base, cand) for fp in side.fingerprints):
        return [], []  # runs from before the record on both sides: nothing to say
    notes = [f"the {side.name} has no recorded environment ({_why_unrecorded(side)}): the drift guard "
             f"cannot compare it" for side in (base, cand) if not side.recorded]
    if notes:  # nothing to compare
        return [], notes
    base_builds, cand_builds = _server_builds(base.fingerprints[0]), _server_builds(cand.fingerprints[0])
    for label in sorted(base_builds.keys() & cand_builds.keys()):
        if base_builds[label] != cand_builds[label]:
            notes.append(f"{label}: server build {_show(base_builds[label])} in the baseline, "
                         f"{_show(cand_builds[label])} in the candidate")
    notes += _boot_notes(base.fingerprints[0], cand.fingerprints[0])
    out = []
    first = base.facts[0]
    unknown: set[str] = set()
    for key in list(first) + sorted(set(cand.facts[0]) - set(first)):
        value = first.get(key)
        # A missing fact is not a changed fact: a side (or a run) that does not know it is not compared.
        differ = [v for f in cand.facts if (v := f.get(key)) != value and v is not None]
        inner = [v for f in base.facts if (v := f.get(key)) != value and v is not None]
        values = [f.get(key) for f in (*base.facts, *cand.facts)]
        if None in values:
            if any(v is not None for v in values):  # unknown everywhere: nothing to say, as for no record
                unknown.add(key)
            continue
        if differ or inner:
            other = (differ or inner)[0]
            out.append(f"{key}: baseline {_show(value)}; "
                       f"{'candidate' if differ else 'another baseline run'} {_show(other)}")
    if unknown:
        notes.append(f"not compared (unknown on a side): {', '.join(sorted(unknown))}")
    out += _level_differences(base.links, cand.links, "PCIe ")
    out += _level_differences(base.mac_levels, cand.mac_levels)
    return out, notes


def changed_levels(docs: Iterable[RunDocument | dict[str, Any]]) -> list[str]:
    """'target at level L: what changed' for every level of these runs whose environment changed during it."""
    out = []
    for doc in docs:
        for t in RunDocument.of(doc).targets:
            for lv in t.machine_levels():
                for change in lv.environment_changed or level_changes(samples_from(lv.environment)):
                    out.append(f"{t.label} at level {lv.name}: {change}")
    return out


def _show(value: Any) -> str:
    if value is None:
        return "unknown"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple | list):
        return "; ".join(map(str, value)) if value else "none"
    return str(value)
