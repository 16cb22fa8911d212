"""The Mac's machine facts, read from the text its own tools print (macOS has no /proc or /sys).

Pure parsers, one per command's output, and the readers that run the commands (each may be
missing or fail: its facts are then None): `read_mac_facts` for `loadgen env`, `read_mac_machine`
(once, the fingerprint's `mac`) and `read_mac_power` (every sample of a run: pmset) for
client/machine_facts.py's `MachineReader` on macOS.

    sysctl -n machdep.cpu.brand_string           "Apple M1 Max"
    sysctl hw.perflevel0.physicalcpu hw.perflevel1.physicalcpu hw.memsize hw.logicalcpu vm.swapusage
        "name: value" lines; perflevel0 is the performance cores, perflevel1 the efficiency cores
        (absent on a Mac with one kind); vm.swapusage "total = 2048.00M  used = 1024.50M  free = ..."
    sw_vers                                      "ProductName:\tmacOS" / "ProductVersion:\t14.5" / "BuildVersion:\t23F79"
    pmset -g                                     " lowpowermode         1" among the settings in use
    pmset -g ps                                  "Now drawing from 'AC Power'" (or 'Battery Power')
    pmset -g therm                               "CPU_Speed_Limit \t= 100" and "... thermal warning level ..."
                                                 lines, or "Note: No thermal warning level has been recorded"
    system_profiler SPDisplaysDataType -json     {"SPDisplaysDataType": [{"sppci_model": "Apple M1 Max",
                                                 "sppci_cores": "32", ...}]}: the Apple GPU and its cores
    vm_stat                                      "(page size of 16384 bytes)", then "Pages free:  12345." lines
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

from ..core.environment import CpuFacts, MacMachine, MacMemory, MacPower, MemoryFacts

GIB = 1024 ** 3
MIB = 1024 ** 2


@dataclass(frozen=True)
class MacFacts:
    chip: str | None = None
    performance_cores: int | None = None
    efficiency_cores: int | None = None
    logical_cores: int | None = None
    memory_bytes: int | None = None
    macos: str | None = None               # "macOS 14.5 (23F79)"
    power_source: str | None = None        # "AC Power", "Battery Power"
    low_power_mode: bool | None = None
    cpu_speed_limit_pct: int | None = None  # 100: not throttled
    thermal_warning: str | None = None     # None: none recorded
    swap_total_mib: float | None = None
    swap_used_mib: float | None = None
    pages_free_bytes: int | None = None
    gpu_model: str | None = None
    gpu_cores: int | None = None
    memory: MacMemory | None = None  # the memory pressure (kern.memorystatus_vm_pressure_level, vm_stat)

    def summary(self) -> str:
        """"Apple M1 Max, 10 cores (8 performance + 2 efficiency), 64 GiB unified memory"."""
        parts = [self.chip or "unknown chip"]
        cores = [n for n in (self.performance_cores, self.efficiency_cores) if n is not None]
        total = sum(cores) if cores else self.logical_cores
        if total:
            split = (f" ({self.performance_cores} performance + {self.efficiency_cores} efficiency)"
                     if self.performance_cores is not None and self.efficiency_cores is not None else "")
            parts.append(f"{total} cores{split}")
        if self.memory_bytes:
            parts.append(f"{self.memory_bytes / GIB:g} GiB unified memory")
        return ", ".join(parts)


def parse_sysctl(text: str) -> dict[str, str]:
    """`sysctl NAME...`'s "name: value" lines (also "name = value", as older releases print)."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"\s*([\w.]+)\s*[:=]\s?(.*)$", line)
        if m:
            out[m.group(1)] = m.group(2).strip()
    return out


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.strip().isdigit() else None


_SIZE = re.compile(r"(total|used|free)\s*=\s*([\d.]+)([KMG])")


def parse_swapusage(value: str) -> tuple[float | None, float | None]:
    """(total, used) MiB of vm.swapusage's "total = 2048.00M  used = 1024.50M  free = 1023.50M  (encrypted)"."""
    scale = {"K": 1 / 1024, "M": 1.0, "G": 1024.0}
    found = {m.group(1): float(m.group(2)) * scale[m.group(3)] for m in _SIZE.finditer(value)}
    return found.get("total"), found.get("used")


def parse_sw_vers(text: str) -> str | None:
    """"macOS 14.5 (23F79)" from sw_vers' ProductName, ProductVersion and BuildVersion lines."""
    fields = parse_sysctl(text)
    name, version, build = fields.get("ProductName"), fields.get("ProductVersion"), fields.get("BuildVersion")
    if not version:
        return None
    return f"{name or 'macOS'} {version}" + (f" ({build})" if build else "")


def parse_low_power_mode(text: str) -> bool | None:
    """`pmset -g`'s lowpowermode setting (1: on); None when the Mac does not list it."""
    m = re.search(r"^\s*lowpowermode\s+(\d)\b", text, re.MULTILINE)
    return None if m is None else m.group(1) == "1"


def parse_power_source(text: str) -> str | None:
    """`pmset -g ps`'s "Now drawing from 'AC Power'" -> "AC Power"."""
    m = re.search(r"drawing from '([^']+)'", text)
    return m.group(1) if m else None


def parse_therm(text: str) -> tuple[int | None, str | None]:
    """(CPU speed limit %, thermal warning) of `pmset -g therm`: the limit from "CPU_Speed_Limit = N",
    100 when "No CPU power status has been recorded" (macOS records one only when it limits the CPU),
    else None; the warning as the tool words it, None when "No thermal warning level has been recorded"."""
    limit = re.search(r"CPU_Speed_Limit\s*=\s*(\d+)", text)
    if limit is None and re.search(r"No CPU power status has been recorded", text, re.IGNORECASE):
        return 100, _thermal_warning(text)
    return (int(limit.group(1)) if limit else None), _thermal_warning(text)


def _thermal_warning(text: str) -> str | None:
    warning = None
    for line in text.splitlines():
        line = line.strip()
        if "thermal warning level" in line.lower() and "no thermal warning level" not in line.lower():
            warning = line.removeprefix("Note:").strip()
    return warning


def parse_vm_stat(text: str) -> dict[str, int]:
    """`vm_stat`'s counts in bytes, by its own names ("Pages free", "Swapins", ...): each "Pages"
    count times the page size of its first line; other counts as they are."""
    m = re.search(r"page size of (\d+) bytes", text)
    page = int(m.group(1)) if m else 4096
    out = {}
    for line in text.splitlines()[1:]:
        name, _, value = line.partition(":")
        value = value.strip().rstrip(".")
        if value.isdigit():
            out[name.strip().strip('"')] = int(value) * (page if name.strip().startswith("Pages") else 1)
    return out


def vm_stat_memory(text: str, pressure_level: int | None = None) -> MacMemory:
    """A `MacMemory` of `vm_stat`'s output (free and compressor pages, Swapins and Swapouts, which
    count pages too) and the kernel's pressure level."""
    m = re.search(r"page size of (\d+) bytes", text)
    page = int(m.group(1)) if m else 4096
    counts = parse_vm_stat(text)

    def mib(name: str, pages: bool = True) -> float | None:
        value = counts.get(name)
        return None if value is None else round(value * (1 if pages else page) / MIB, 1)
    return MacMemory(pressure_level=pressure_level, free_mib=mib("Pages free"),
                     compressed_mib=mib("Pages occupied by compressor"),
                     swapped_in_mib=mib("Swapins", pages=False), swapped_out_mib=mib("Swapouts", pages=False))


def parse_displays(text: str) -> tuple[str | None, int | None]:
    """(model, cores) of the first GPU in `system_profiler SPDisplaysDataType -json` that states its
    cores (an Apple GPU: `sppci_cores` "32"), else of the first GPU listed; (None, None) when the text
    is not that JSON."""
    try:
        gpus = json.loads(text).get("SPDisplaysDataType") or []
    except (ValueError, AttributeError):
        return None, None
    gpus = [g for g in gpus if isinstance(g, dict)]
    gpu = next((g for g in gpus if _int(str(g.get("sppci_cores", ""))) is not None), gpus[0] if gpus else {})
    model = gpu.get("sppci_model") or gpu.get("_name")
    return (str(model) if model else None), _int(str(gpu.get("sppci_cores", "")))


_POWER = {"cpu_mw": r"CPU Power", "gpu_mw": r"GPU Power", "ane_mw": r"ANE Power",
          "combined_mw": r"Combined Power \(CPU \+ GPU \+ ANE\)"}


def parse_powermetrics(text: str) -> dict[str, float]:
    """The powers of `powermetrics --samplers cpu_power,gpu_power,ane_power` (mW): "CPU Power: 1234 mW",
    "GPU Power: 56 mW", "ANE Power: 0 mW", "Combined Power (CPU + GPU + ANE): 1290 mW"; the first of each
    (macOS 12 prints "GPU Power" in both the CPU and the GPU section, the same figure), a figure in W
    ("1.23 W") as mW. Keys: cpu_mw, gpu_mw, ane_mw, combined_mw; a power not printed is absent."""
    out = {}
    for key, label in _POWER.items():
        m = re.search(rf"^\s*{label}:\s*([\d.]+)\s*(mW|W)\b", text, re.MULTILINE)
        if m:
            out[key] = float(m.group(1)) * (1000.0 if m.group(2) == "W" else 1.0)
    return out


Run = Callable[[list[str]], str | None]


def run_tool(argv: list[str]) -> str | None:
    """The command's stdout, or None when it is missing, fails with nothing said, or hangs. A failure
    that still printed is kept: `sysctl` asked for several names prints the ones it knows and fails
    on one it does not (hw.perflevel1 on a Mac with one kind of core)."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 or done.stdout.strip() else None


def read_mac_machine(run: Run = run_tool) -> MacMachine:
    """What the Mac is (sysctl, sw_vers): read once, into a run's fingerprint."""
    ctl = parse_sysctl(run(["sysctl", "machdep.cpu.brand_string", "hw.perflevel0.physicalcpu",
                            "hw.perflevel1.physicalcpu", "hw.memsize"]) or "")
    versions = run(["sw_vers"])
    gpu_model, gpu_cores = parse_displays(run(["system_profiler", "SPDisplaysDataType", "-json"]) or "")
    return MacMachine(chip=ctl.get("machdep.cpu.brand_string") or None,
                      performance_cores=_int(ctl.get("hw.perflevel0.physicalcpu")),
                      efficiency_cores=_int(ctl.get("hw.perflevel1.physicalcpu")),
                      memory_bytes=_int(ctl.get("hw.memsize")), macos=parse_sw_vers(versions) if versions else None,
                      gpu_model=gpu_model, gpu_cores=gpu_cores)


def read_mac_power(run: Run = run_tool) -> MacPower:
    """The Mac's power and thermal state now (pmset): read with every sample of a run."""
    pmset, ps = run(["pmset", "-g"]), run(["pmset", "-g", "ps"])
    speed, warning = parse_therm(run(["pmset", "-g", "therm"]) or "")
    return MacPower(power_source=parse_power_source(ps) if ps else None,
                    low_power_mode=parse_low_power_mode(pmset) if pmset else None,
                    cpu_speed_limit_pct=speed, thermal_warning=warning)


def read_mac_swap(run: Run = run_tool) -> tuple[float | None, float | None]:
    """(total, used) MiB of swap (sysctl vm.swapusage)."""
    return parse_swapusage(parse_sysctl(run(["sysctl", "vm.swapusage"]) or "").get("vm.swapusage", ""))


def read_mac_memory(run: Run = run_tool) -> MacMemory:
    """The Mac's memory pressure now (sysctl kern.memorystatus_vm_pressure_level, vm_stat): read with
    every sample of a run."""
    return vm_stat_memory(run(["vm_stat"]) or "", _pressure_level(run))


def _pressure_level(run: Run) -> int | None:
    return _int(parse_sysctl(run(["sysctl", "kern.memorystatus_vm_pressure_level"]) or "")
                .get("kern.memorystatus_vm_pressure_level"))


def read_mac_facts(run: Run = run_tool) -> MacFacts:
    """Every fact the Mac's tools give; a tool that is missing or fails leaves its facts None."""
    machine, power = read_mac_machine(run), read_mac_power(run)
    logical = _int(parse_sysctl(run(["sysctl", "hw.logicalcpu"]) or "").get("hw.logicalcpu"))
    swap_total, swap_used = read_mac_swap(run)
    vm_text = run(["vm_stat"]) or ""
    memory, vm = vm_stat_memory(vm_text, _pressure_level(run)), parse_vm_stat(vm_text)
    return MacFacts(chip=machine.chip, performance_cores=machine.performance_cores,
                    efficiency_cores=machine.efficiency_cores, logical_cores=logical,
                    memory_bytes=machine.memory_bytes, macos=machine.macos, power_source=power.power_source,
                    low_power_mode=power.low_power_mode, cpu_speed_limit_pct=power.cpu_speed_limit_pct,
                    thermal_warning=power.thermal_warning, swap_total_mib=swap_total, swap_used_mib=swap_used,
                    pages_free_bytes=vm.get("Pages free"),
                    gpu_model=machine.gpu_model, gpu_cores=machine.gpu_cores,
                    memory=None if memory == MacMemory() else memory)


def mac_cpu_memory(machine: MacMachine, run: Run = run_tool) -> tuple[CpuFacts, MemoryFacts]:
    """A Mac's CPU and memory as a fingerprint's `cpu` and `memory` (what Linux's /proc gives):
    the chip and its cores, the unified memory, free pages (vm_stat) and swap."""
    logical = _int(parse_sysctl(run(["sysctl", "hw.logicalcpu"]) or "").get("hw.logicalcpu"))
    split = [n for n in (machine.performance_cores, machine.efficiency_cores) if n is not None]
    swap_total, swap_used = read_mac_swap(run)
    free = parse_vm_stat(run(["vm_stat"]) or "").get("Pages free")
    return (CpuFacts(model=machine.chip, logical_cores=logical or sum(split)),
            MemoryFacts(total_mib=machine.memory_bytes // MIB if machine.memory_bytes else None,
                        available_mib=free // MIB if free is not None else None,
                        swap_total_mib=_whole(swap_total), swap_used_mib=_whole(swap_used)))


def _whole(mib: float | None) -> int | None:
    return None if mib is None else int(mib)


def mac_lines(facts: MacFacts) -> list[str]:
    """`loadgen env`'s lines for a Mac."""
    lines = [f"Mac: {facts.summary()}"]
    if facts.gpu_model or facts.gpu_cores:
        cores = f", {facts.gpu_cores} cores" if facts.gpu_cores else ""
        lines.append(f"GPU: {facts.gpu_model or 'unknown'}{cores}")
    lines.append(f"OS: {facts.macos or 'unknown'}")
    power = facts.power_source or "unknown power source"
    mode = {True: "Low Power Mode on", False: "Low Power Mode off", None: "Low Power Mode unknown"}[facts.low_power_mode]
    lines.append(f"power: {power}, {mode}")
    limit = "unknown" if facts.cpu_speed_limit_pct is None else f"{facts.cpu_speed_limit_pct}%"
    lines.append(f"thermal: {facts.thermal_warning or 'no thermal warning recorded'}; CPU speed limit {limit}")
    if facts.swap_total_mib is not None:
        lines.append(f"swap: {facts.swap_total_mib:g} MiB, {facts.swap_used_mib or 0:g} MiB used")
    memory = facts.memory
    if memory is not None and (memory.pressure is not None or memory.compressed_mib is not None):
        compressed = "" if memory.compressed_mib is None else f", {memory.compressed_mib:g} MiB compressed"
        lines.append(f"memory pressure: {memory.pressure or 'unknown'}{compressed}")
    return lines
