"""Reading the machine: sysfs and procfs under configurable roots, and the GPUs through NVML or nvidia-smi.

Like node_exporter's `--path.sysfs`/`--path.procfs`, every file is read under `Roots`, so another
tree (a container's, a copy, one a test builds) is read the same way as the live one. A file that
is missing or unreadable is a None field, never an error: hosts expose different subsets (a VM has
no cpufreq, an AMD host's RAPL may be absent, a container hides /sys/class/powercap).

GPUs are read only from the live machine (the roots are "/sys" and "/proc"): NVML through NVIDIA's
`nvidia-ml-py` (the optional extra `nvml`) first, else `nvidia-smi --query-gpu`; a test passes its
own `gpu_reader`.

What is read, and where (paths under the roots):
    proc/cpuinfo ("model name", "processor"), proc/meminfo, proc/stat (the `cpu` line: steal is its
    8th value), proc/sys/kernel/osrelease;
    sys/devices/system/cpu/cpuN/cpufreq/{scaling_governor,cpuinfo_min_freq,cpuinfo_max_freq,
    scaling_cur_freq} (kHz), sys/devices/system/cpu/intel_pstate/no_turbo, .../cpufreq/boost;
    sys/class/powercap/intel-rapl:N/{name,energy_uj,max_energy_range_uj,constraint_K_name,
    constraint_K_power_limit_uw,
    constraint_K_max_power_uw} (top-level zones only: sub-zones are part of their package);
    sys/bus/pci/devices/ADDR/{class,current_link_speed,current_link_width,max_link_speed,max_link_width};
    sys/class/hwmon/hwmonN/{name,tempK_input (m°C),tempK_label}.
"""

from __future__ import annotations

import csv
import io
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from .. import __version__
from ..core.environment import (
    CpuFacts,
    CpuTimes,
    EnvSample,
    Fingerprint,
    GpuFacts,
    MemoryFacts,
    PciLink,
    RaplZone,
    Temperature,
    pcie_generation,
)
from . import mac_facts, mac_power

# NVML's clock-event (throttle) reason bits, as nvidia-smi's clocks_event_reasons.active reports them too.
THROTTLE_BITS = {0x1: "gpu_idle", 0x2: "applications_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
                 0x10: "sync_boost", 0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake",
                 0x100: "display_clocks"}
SMI_FIELDS = ("index", "name", "pci.bus_id", "driver_version", "pcie.link.gen.current", "pcie.link.gen.max",
              "pcie.link.width.current", "pcie.link.width.max", "power.limit", "power.default_limit",
              "power.draw", "clocks.sm", "clocks.mem", "clocks_event_reasons.active", "temperature.gpu",
              "memory.used")
SMI_TIMEOUT_S = 10

GpuReader = Callable[[], tuple[str | None, tuple[GpuFacts, ...]]]


@dataclass(frozen=True)
class Roots:
    """Where sysfs and procfs are mounted (node_exporter's --path.sysfs, --path.procfs)."""

    sysfs: Path = Path("/sys")
    procfs: Path = Path("/proc")

    @property
    def live(self) -> bool:
        return self.sysfs == Path("/sys") and self.procfs == Path("/proc")


def _text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


def _int(path: Path) -> int | None:
    text = _text(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _cpu_dirs(roots: Roots) -> list[Path]:
    base = roots.sysfs / "devices/system/cpu"
    try:
        return sorted((p for p in base.iterdir() if re.fullmatch(r"cpu\d+", p.name)), key=lambda p: int(p.name[3:]))
    except OSError:
        return []


def _governors_and_freq(roots: Roots) -> tuple[tuple[str, ...], float | None]:
    governors, cur = set(), []
    for d in _cpu_dirs(roots):
        g = _text(d / "cpufreq/scaling_governor")
        if g:
            governors.add(g)
        khz = _int(d / "cpufreq/scaling_cur_freq")
        if khz is not None:
            cur.append(khz / 1000)
    return tuple(sorted(governors)), (sum(cur) / len(cur) if cur else None)


def _turbo(roots: Roots) -> bool | None:
    no_turbo = _int(roots.sysfs / "devices/system/cpu/intel_pstate/no_turbo")
    if no_turbo is not None:
        return no_turbo == 0
    boost = _int(roots.sysfs / "devices/system/cpu/cpufreq/boost")
    return None if boost is None else boost == 1


def read_cpu(roots: Roots) -> CpuFacts:
    info = _text(roots.procfs / "cpuinfo") or ""
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines()
                  if line.startswith(("model name", "Model")) and ":" in line), None)
    cores = sum(1 for line in info.splitlines() if re.match(r"processor\s*:", line)) or len(_cpu_dirs(roots))
    dirs = _cpu_dirs(roots)
    mins = [v for d in dirs if (v := _int(d / "cpufreq/cpuinfo_min_freq")) is not None]
    maxs = [v for d in dirs if (v := _int(d / "cpufreq/cpuinfo_max_freq")) is not None]
    governors, cur = _governors_and_freq(roots)
    return CpuFacts(model=model, logical_cores=cores, governors=governors,
                    min_mhz=min(mins) / 1000 if mins else None, max_mhz=max(maxs) / 1000 if maxs else None,
                    cur_mhz_mean=cur, turbo=_turbo(roots))


def _meminfo(roots: Roots) -> dict[str, int]:
    out = {}
    for line in (_text(roots.procfs / "meminfo") or "").splitlines():
        m = re.match(r"(\w+):\s+(\d+)\s*kB", line)
        if m:
            out[m.group(1)] = int(m.group(2))
    return out


def read_memory(roots: Roots) -> MemoryFacts:
    mem = _meminfo(roots)

    def mib(key: str) -> int | None:
        return mem[key] // 1024 if key in mem else None
    swap_used = (mem["SwapTotal"] - mem["SwapFree"]) // 1024 if {"SwapTotal", "SwapFree"} <= mem.keys() else None
    return MemoryFacts(total_mib=mib("MemTotal"), available_mib=mib("MemAvailable"),
                       swap_total_mib=mib("SwapTotal"), swap_used_mib=swap_used)


def read_cpu_times(roots: Roots) -> CpuTimes | None:
    for line in (_text(roots.procfs / "stat") or "").splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            values = [int(v) for v in fields[1:] if v.isdigit()]
            # user nice system idle iowait irq softirq steal [guest guest_nice]: guest time is
            # already inside user/nice, so the total is the first eight.
            return CpuTimes(total_jiffies=sum(values[:8]), steal_jiffies=values[7] if len(values) > 7 else 0)
    return None


def read_rapl(roots: Roots) -> tuple[RaplZone, ...]:
    base = roots.sysfs / "class/powercap"
    try:
        zones = sorted(p for p in base.iterdir() if re.fullmatch(r"intel-rapl:\d+", p.name))
    except OSError:
        return ()
    out = []
    for z in zones:
        limits, maxima = {}, {}
        for k in range(8):
            name = _text(z / f"constraint_{k}_name")
            uw = _int(z / f"constraint_{k}_power_limit_uw")
            if name is None or uw is None:
                break
            limits[name] = uw / 1e6
            top = _int(z / f"constraint_{k}_max_power_uw")
            if top:
                maxima[name] = top / 1e6
        out.append(RaplZone(zone=z.name, name=_text(z / "name") or z.name, energy_uj=_int(z / "energy_uj"),
                            max_energy_range_uj=_int(z / "max_energy_range_uj"), limits_w=limits,
                            max_w=maxima))
    return tuple(out)


def _natural(name: str) -> tuple[str, int]:
    """"hwmon10" after "hwmon9"; "temp10_input" after "temp9_input"."""
    m = re.match(r"(\D*)(\d+)", name)
    return (m.group(1), int(m.group(2))) if m else (name, -1)


def read_hwmon(roots: Roots) -> tuple[Temperature, ...]:
    """Every hwmon temperature sensor, chip by chip (node_exporter's hwmon collector reads the same files)."""
    base = roots.sysfs / "class/hwmon"
    try:
        chips = sorted(base.iterdir(), key=lambda p: _natural(p.name))
    except OSError:
        return ()
    out = []
    for chip in chips:
        name = _text(chip / "name") or chip.name
        try:
            inputs = [p for p in chip.iterdir() if re.fullmatch(r"temp\d+_input", p.name)]
        except OSError:
            continue
        for path in inputs:
            millidegrees = _int(path)
            if millidegrees is not None:
                sensor = path.name.removesuffix("_input")
                out.append((name, _natural(sensor)[1], Temperature(
                    chip=name, sensor=_text(chip / f"{sensor}_label") or sensor, celsius=millidegrees / 1000)))
    return sorted_temperatures(out)


def sorted_temperatures(found: list[tuple[str, int, Temperature]]) -> tuple[Temperature, ...]:
    """(chip, K of tempK, reading) in the one order both readers give: by chip name, then K."""
    return tuple(t for _, _, t in sorted(found, key=lambda f: f[:2]))


def _width(path: Path) -> int | None:
    value = _int(path)
    return value if value else None  # 0: no link trained (an empty slot's bridge)


def read_pci_links(roots: Roots) -> tuple[PciLink, ...]:
    base = roots.sysfs / "bus/pci/devices"
    try:
        devices = sorted(base.iterdir())
    except OSError:
        return ()
    out = []
    for d in devices:
        speed = _text(d / "current_link_speed")
        if speed is None:
            continue
        out.append(PciLink(address=d.name, pci_class=(_text(d / "class") or "0x000000")[:8],
                           gen=pcie_generation(speed), width=_width(d / "current_link_width"),
                           max_gen=pcie_generation(_text(d / "max_link_speed")),
                           max_width=_width(d / "max_link_width")))
    return tuple(out)


def _os_name() -> str | None:
    try:
        return platform.freedesktop_os_release().get("PRETTY_NAME")
    except OSError:
        return platform.system() or None


# --- GPUs -------------------------------------------------------------------------------------------

def _reasons(mask: int | None) -> tuple[str, ...]:
    if not mask:
        return ()
    return tuple(name for bit, name in THROTTLE_BITS.items() if mask & bit and bit != 0x1)  # idle is no throttle


def read_nvml() -> tuple[GpuFacts, ...] | None:
    """Every GPU through NVML; None when nvidia-ml-py or the driver is not there."""
    try:
        import pynvml  # the optional extra `nvml` (nvidia-ml-py)
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        # Any: NVML's getters return ints, strings and structs; each use below reads its own kind.
        def get(fn: Callable[..., Any], *args: object) -> Any:
            try:
                return fn(*args)
            except (pynvml.NVMLError, AttributeError):
                return None
        driver = get(pynvml.nvmlSystemGetDriverVersion)
        out = []
        for i in range(int(get(pynvml.nvmlDeviceGetCount) or 0)):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name, pci = get(pynvml.nvmlDeviceGetName, h), get(pynvml.nvmlDeviceGetPciInfo, h)
            mem = get(pynvml.nvmlDeviceGetMemoryInfo, h)
            reasons = get(getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or
                          pynvml.nvmlDeviceGetCurrentClocksThrottleReasons, h)
            procs = get(pynvml.nvmlDeviceGetComputeRunningProcesses, h)
            limit, default, draw = (get(f, h) for f in (pynvml.nvmlDeviceGetPowerManagementLimit,
                                                         pynvml.nvmlDeviceGetPowerManagementDefaultLimit,
                                                         pynvml.nvmlDeviceGetPowerUsage))
            bus = getattr(pci, "busId", None)
            out.append(GpuFacts(
                index=i, name=_str(name) or f"GPU {i}", bus_id=_str(bus), driver=_str(driver),
                pcie_gen=get(pynvml.nvmlDeviceGetCurrPcieLinkGeneration, h),
                pcie_width=get(pynvml.nvmlDeviceGetCurrPcieLinkWidth, h),
                pcie_max_gen=get(pynvml.nvmlDeviceGetMaxPcieLinkGeneration, h),
                pcie_max_width=get(pynvml.nvmlDeviceGetMaxPcieLinkWidth, h),
                power_limit_w=_mw(limit), power_default_limit_w=_mw(default), power_draw_w=_mw(draw),
                energy_mj=get(pynvml.nvmlDeviceGetTotalEnergyConsumption, h),
                sm_clock_mhz=get(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM),
                mem_clock_mhz=get(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_MEM),
                throttle_reasons=_reasons(reasons),
                temperature_c=get(pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU),
                memory_used_mib=int(mem.used) // 2**20 if mem is not None else None,
                processes=len(procs) if procs is not None else None,
                source="nvml"))
        return tuple(out)
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def _str(value: object) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def _mw(value: float | None) -> float | None:
    return None if value is None else float(value) / 1000


def parse_smi_csv(text: str) -> tuple[GpuFacts, ...]:
    """`nvidia-smi --query-gpu=SMI_FIELDS --format=csv,noheader,nounits` -> one record per GPU.
    "[N/A]" and "[Not Supported]" are None."""
    def num(v: str) -> float | None:
        try:
            return float(v)
        except ValueError:
            return None

    def whole(v: str) -> int | None:
        n = num(v)
        return None if n is None else int(n)
    out = []
    for row in csv.reader(io.StringIO(text), skipinitialspace=True):
        if len(row) < len(SMI_FIELDS):
            continue
        f = dict(zip(SMI_FIELDS, (v.strip() for v in row)))
        mask = f["clocks_event_reasons.active"]
        out.append(GpuFacts(
            index=whole(f["index"]) or 0, name=f["name"], bus_id=f["pci.bus_id"] or None,
            driver=f["driver_version"] or None,
            pcie_gen=whole(f["pcie.link.gen.current"]), pcie_max_gen=whole(f["pcie.link.gen.max"]),
            pcie_width=whole(f["pcie.link.width.current"]), pcie_max_width=whole(f["pcie.link.width.max"]),
            power_limit_w=num(f["power.limit"]), power_default_limit_w=num(f["power.default_limit"]),
            power_draw_w=num(f["power.draw"]),
            sm_clock_mhz=whole(f["clocks.sm"]), mem_clock_mhz=whole(f["clocks.mem"]),
            throttle_reasons=_reasons(int(mask, 16) if mask.startswith("0x") else None),
            temperature_c=whole(f["temperature.gpu"]), memory_used_mib=whole(f["memory.used"]),
            source="nvidia-smi"))
    return tuple(out)


def read_nvidia_smi() -> tuple[GpuFacts, ...] | None:
    """Every GPU through `nvidia-smi --query-gpu`; None when it is not installed or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        done = subprocess.run([exe, f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=SMI_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_smi_csv(done.stdout) if done.returncode == 0 else None


def read_gpus() -> tuple[str | None, tuple[GpuFacts, ...]]:
    """(source, GPUs): NVML first, nvidia-smi second; (None, ()) when neither answers."""
    gpus = read_nvml()
    if gpus is not None:
        return "nvml", gpus
    gpus = read_nvidia_smi()
    if gpus is not None:
        return "nvidia-smi", gpus
    return None, ()


def no_gpus() -> tuple[str | None, tuple[GpuFacts, ...]]:
    return None, ()


# --- the records ------------------------------------------------------------------------------------

class MachineReader:
    """Reads fingerprints and samples of one machine (the roots), GPUs by `gpu_reader` (default: the
    live machine's through NVML/nvidia-smi when the roots are the live ones, else none). With a
    `telemetry` reader (client/telemetry.py) the machine is the exporters' instead: a remote server's."""

    def __init__(self, roots: Roots | None = None, gpu_reader: GpuReader | None = None, telemetry: Any = None,
                 mac_tools: mac_facts.Run | None = None):
        self.roots = roots or Roots()
        self.gpu_reader = gpu_reader or (read_gpus if self.roots.live else no_gpus)
        self.gpu_source: str | None = None
        self.telemetry = telemetry
        # On macOS (no /proc or /sys there: what the roots hold is read too, usually nothing) the
        # Mac's own tools (client/mac_facts.py) give the fingerprint and each sample's power state.
        self.mac_tools = mac_tools or (mac_facts.run_tool if sys.platform == "darwin" and telemetry is None
                                       else None)
        self.notes: list[str] = []  # said once, before the run: powermetrics could not be run
        self._meter: mac_power.PowerMeter | None = None
        self._meter_tried = False

    def sample(self, at_s: float) -> EnvSample:
        if self.telemetry is not None:
            return self.telemetry.sample(at_s)
        roots = self.roots
        governors, cur = _governors_and_freq(roots)
        self.gpu_source, gpus = self.gpu_reader()
        # Only the accelerators' links: the ones a figure depends on (bridges and idle NICs lower
        # theirs at idle), and a host has dozens of the others to fill every sample with.
        links = tuple(link for link in read_pci_links(roots) if link.is_accelerator)
        names = {_bus_key(g.bus_id): g.name for g in gpus if g.bus_id}
        links = tuple(msgspec.structs.replace(link, name=names.get(_bus_key(link.address))) for link in links)
        sample = EnvSample(at_s=at_s, links=links, governors=governors, cur_mhz_mean=cur, turbo=_turbo(roots),
                           rapl=read_rapl(roots), cpu_times=read_cpu_times(roots),
                           swap_used_mib=read_memory(roots).swap_used_mib, gpus=gpus,
                           temperatures=read_hwmon(roots))
        return msgspec.structs.replace(sample, **self._mac_sample(at_s)) if self.mac_tools is not None else sample

    def _mac_sample(self, at_s: float) -> dict[str, Any]:
        """A sample's Mac fields: its power and thermal state (pmset), swap in use (vm.swapusage), memory
        pressure (kern.memorystatus_vm_pressure_level, vm_stat) and,
        where powermetrics runs (root), CPU, GPU and ANE power and energy (client/mac_power.py)."""
        assert self.mac_tools is not None
        _, swap_used = mac_facts.read_mac_swap(self.mac_tools)
        if not self._meter_tried:
            self._meter_tried = True
            self._meter, note = mac_power.power_meter(self.mac_tools)
            self.notes += [note] if note else []
        return {"mac": mac_facts.read_mac_power(self.mac_tools),
                "swap_used_mib": None if swap_used is None else int(swap_used),
                "mac_memory": mac_facts.read_mac_memory(self.mac_tools),
                "mac_energy": self._meter.read(at_s) if self._meter is not None else None}

    def fingerprint(self, server: dict | None = None, at_s: float = 0.0) -> Fingerprint:
        """The machine now; `at_s` dates its sample (a Mac's power meter integrates from then)."""
        roots = self.roots
        sample = self.sample(at_s)
        if self.telemetry is not None:
            os_name, kernel, cpu, memory = self.telemetry.facts()
            return Fingerprint(loadgen=__version__, python=_python(), os=os_name, kernel=kernel,
                               cpu=cpu, memory=memory, sample=sample,
                               gpu_source="dcgm-exporter" if sample.gpus else None, server=server,
                               telemetry=self.telemetry.urls)
        if self.mac_tools is not None:
            machine = mac_facts.read_mac_machine(self.mac_tools)
            cpu, memory = mac_facts.mac_cpu_memory(machine, self.mac_tools)
            return Fingerprint(loadgen=__version__, python=_python(), os=machine.macos or _os_name(),
                               kernel=platform.release() or None, cpu=cpu, memory=memory, sample=sample,
                               gpu_source=self.gpu_source, server=server, mac=machine)
        return Fingerprint(loadgen=__version__, python=_python(),
                           os=_os_name() if roots.live else None,
                           kernel=_text(roots.procfs / "sys/kernel/osrelease"), cpu=read_cpu(roots),
                           memory=read_memory(roots), sample=sample, gpu_source=self.gpu_source, server=server)


def _python() -> str:
    return f"{platform.python_version()} ({sys.implementation.name})"


def _bus_key(bus_id: str | None) -> str:
    """NVML's "00000000:01:00.0" and sysfs's "0000:01:00.0" -> "01:00.0" (domain dropped), lowercase."""
    return (bus_id or "").lower().split(":", 1)[-1] if (bus_id or "").count(":") >= 2 else (bus_id or "").lower()

