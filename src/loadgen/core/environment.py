"""The machine under the numbers: what a run records of the host it measured on (docs/environment.md).

A `Fingerprint` is read once before a run (client/machine_facts.py) and an `EnvSample` at the start
and end of every level and at each probe interval during it, so a change mid-level (a PCIe link
that downshifts, a power cap that appears) is seen where it happened. Both are plain records:
the readers fill them, analysis/env_drift.py and analysis/energy.py compare and add them up, and
run.json stores them as `environment` (run-wide) and per level `environment` (samples).

Units are in the field names: `_mhz`, `_w`, `_uj` (microjoules), `_mib`, `_jiffies`.
"""

from __future__ import annotations

from typing import Any

import msgspec

# PCIe transfer rate per lane (GT/s, as sysfs writes it) -> generation.
PCIE_GENERATIONS = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}


def pcie_generation(speed: str | float | None) -> int | None:
    """"16.0 GT/s PCIe" (sysfs's current_link_speed) or 16.0 -> 4; None when unknown."""
    if speed is None:
        return None
    try:
        rate = float(str(speed).split()[0])
    except (ValueError, IndexError):
        return None
    return PCIE_GENERATIONS.get(rate)


class PciLink(msgspec.Struct, frozen=True, kw_only=True):
    """One PCI device's link as the kernel reports it (sysfs current/max_link_speed and width)."""

    address: str  # "0000:01:00.0"
    pci_class: str  # "0x030000": display controller; see `is_accelerator`
    gen: int | None
    width: int | None
    max_gen: int | None
    max_width: int | None
    name: str | None = None  # a GPU's name when NVML/nvidia-smi matched its bus id

    @property
    def is_accelerator(self) -> bool:
        """Display/3D controllers (0x03xxxx) and processing accelerators (0x12xxxx): the links a
        figure depends on. Bridges and idle NICs lower theirs at idle, which means nothing here."""
        return self.pci_class.startswith(("0x03", "0x12"))

    @property
    def below_max(self) -> bool:
        return (self.gen is not None and self.max_gen is not None and self.gen < self.max_gen) or \
            (self.width is not None and self.max_width is not None and self.width < self.max_width)

    def describe(self) -> str:
        def one(gen: int | None, width: int | None) -> str:
            return f"Gen{gen if gen is not None else '?'} x{width if width is not None else '?'}"
        return f"PCIe {one(self.gen, self.width)} (max {one(self.max_gen, self.max_width)})"


class RaplZone(msgspec.Struct, frozen=True, kw_only=True):
    """A RAPL power zone (sysfs class/powercap/intel-rapl:N): its energy counter and power limits."""

    zone: str  # "intel-rapl:0"
    name: str  # "package-0", "psys", "dram"
    energy_uj: int | None
    max_energy_range_uj: int | None
    limits_w: dict[str, float] = {}  # constraint name ("long_term", "short_term") -> limit in W
    max_w: dict[str, float] = {}  # constraint name -> the most it may be set to (constraint_K_max_power_uw)


class GpuFacts(msgspec.Struct, frozen=True, kw_only=True):
    """One GPU as NVML (or nvidia-smi) reports it; a field it could not read is None."""

    index: int
    name: str
    bus_id: str | None = None
    driver: str | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None
    pcie_max_gen: int | None = None
    pcie_max_width: int | None = None
    power_limit_w: float | None = None
    power_default_limit_w: float | None = None
    power_draw_w: float | None = None
    energy_mj: int | None = None  # total energy since the driver loaded (NVML), millijoules
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    throttle_reasons: tuple[str, ...] = ()  # "sw_power_cap", "hw_slowdown", "sw_thermal", ...
    temperature_c: int | None = None
    memory_used_mib: int | None = None
    processes: int | None = None  # compute processes on it (other tenants show here)
    source: str = "nvml"  # "nvml" or "nvidia-smi"


class CpuFacts(msgspec.Struct, frozen=True, kw_only=True):
    model: str | None
    logical_cores: int
    governors: tuple[str, ...] = ()  # the distinct scaling governors of the CPUs (one, usually)
    min_mhz: float | None = None
    max_mhz: float | None = None
    cur_mhz_mean: float | None = None
    turbo: bool | None = None  # intel_pstate/no_turbo inverted, or cpufreq/boost; None: unknown


class MemoryFacts(msgspec.Struct, frozen=True, kw_only=True):
    total_mib: int | None
    available_mib: int | None
    swap_total_mib: int | None
    swap_used_mib: int | None


class CpuTimes(msgspec.Struct, frozen=True, kw_only=True):
    """The aggregate `cpu` line of /proc/stat: cumulative jiffies, all and stolen (by the hypervisor)."""

    total_jiffies: int
    steal_jiffies: int


class Temperature(msgspec.Struct, frozen=True, kw_only=True):
    """One hwmon temperature sensor (sysfs class/hwmon/hwmonN/tempK_input): its chip (the `name`
    file: coretemp, k10temp, nvme, amdgpu), its sensor (the `tempK_label` file, else "tempK") and °C."""

    chip: str
    sensor: str
    celsius: float


class MacPower(msgspec.Struct, frozen=True, kw_only=True):
    """A Mac's power and thermal state, as `pmset -g`, `pmset -g ps` and `pmset -g therm` print it
    (client/mac_facts.py); None: the tool did not say. What can change under a run on a Mac, as a
    PCIe link or a power cap can on Linux."""

    power_source: str | None = None  # "AC Power", "Battery Power"
    low_power_mode: bool | None = None
    cpu_speed_limit_pct: int | None = None  # 100: not held back
    thermal_warning: str | None = None  # the warning as pmset words it; None: none recorded


class MacMachine(msgspec.Struct, frozen=True, kw_only=True):
    """What a Mac is (sysctl, sw_vers): the fingerprint's `mac`. The chip, its cores and its memory
    are also the fingerprint's `cpu` and `memory`, and macOS its `os`, so the drift guard compares them
    as it compares Linux's."""

    chip: str | None = None  # "Apple M1 Max" (machdep.cpu.brand_string)
    performance_cores: int | None = None  # hw.perflevel0.physicalcpu
    efficiency_cores: int | None = None  # hw.perflevel1.physicalcpu
    memory_bytes: int | None = None  # hw.memsize: unified memory, shared by the CPU and the GPU
    macos: str | None = None  # "macOS 14.5 (23F79)"
    gpu_model: str | None = None  # "Apple M1 Max" (system_profiler SPDisplaysDataType's sppci_model)
    gpu_cores: int | None = None  # the Apple GPU's cores (its sppci_cores)


# kern.memorystatus_vm_pressure_level's values (the dispatch memory-pressure levels), as Activity
# Monitor's Memory Pressure graph colours them: green, yellow, red.
MAC_PRESSURE = {1: "normal", 2: "warning", 4: "critical"}


class MacMemory(msgspec.Struct, frozen=True, kw_only=True):
    """A Mac's memory pressure now (client/mac_facts.py): the kernel's pressure level (`sysctl
    kern.memorystatus_vm_pressure_level`: 1 normal, 2 warning, 4 critical; `MAC_PRESSURE`) and
    `vm_stat`'s pages in MiB: free, held by the compressor ("Pages occupied by compressor"), and
    swapped in and out since boot ("Swapins", "Swapouts": counters). None: the tool did not say."""

    pressure_level: int | None = None
    free_mib: float | None = None
    compressed_mib: float | None = None
    swapped_in_mib: float | None = None
    swapped_out_mib: float | None = None

    @property
    def pressure(self) -> str | None:
        """"normal", "warning", "critical" (or "level N" for a value macOS has not used so far)."""
        level = self.pressure_level
        return None if level is None else MAC_PRESSURE.get(level, f"level {level}")


class MacEnergy(msgspec.Struct, frozen=True, kw_only=True):
    """Apple Silicon's power as `powermetrics` measured it over its sample window (mW; None: it did
    not say), and the energy since the run's first reading (J): the powers integrated over time,
    trapezoid between readings, so that analysis/energy.py uses them as Linux's RAPL counters."""

    cpu_mw: float | None = None
    gpu_mw: float | None = None
    ane_mw: float | None = None
    combined_mw: float | None = None  # "Combined Power (CPU + GPU + ANE)"
    cpu_j: float | None = None
    gpu_j: float | None = None
    ane_j: float | None = None


class EnvSample(msgspec.Struct, frozen=True, kw_only=True):
    """What can change under a run, read at one moment. `at_s`: seconds since the run's start."""

    at_s: float
    links: tuple[PciLink, ...] = ()
    governors: tuple[str, ...] = ()
    cur_mhz_mean: float | None = None
    turbo: bool | None = None
    rapl: tuple[RaplZone, ...] = ()
    cpu_times: CpuTimes | None = None
    swap_used_mib: int | None = None
    gpus: tuple[GpuFacts, ...] = ()
    temperatures: tuple[Temperature, ...] = ()  # hwmon's (absent from runs before they were read)
    mac: MacPower | None = None  # on macOS: power source, Low Power Mode, thermal state (None elsewhere)
    mac_energy: MacEnergy | None = None  # on macOS with powermetrics (root): CPU, GPU, ANE power and energy
    mac_memory: MacMemory | None = None  # on macOS: memory pressure, compressed and swapped pages (vm_stat)


class ServerBoot(msgspec.Struct, frozen=True, kw_only=True):
    """What a server that loadgen started itself (`loadgen grid`) was told and decided at boot: its
    flags (without the program and the port loadgen picked) and what its boot log states
    (analysis/bootlog.py `server_boot`); None: the log does not say."""

    flags: tuple[str, ...] = ()
    build: str | None = None
    n_slots: int | None = None
    n_ctx_slot: int | None = None
    kv_unified: bool | None = None
    flash_attn: bool | None = None
    fit: tuple[str, ...] | None = None  # what --fit did ("context 65536 → 4096", "no changes needed")
    offloaded_layers: str | None = None  # "N/M" layers on the GPU
    http_threads: int | None = None


class Fingerprint(msgspec.Struct, frozen=True, kw_only=True):
    """The host a run measured on, read before its first level (docs/environment.md)."""

    loadgen: str
    python: str
    os: str | None
    kernel: str | None
    cpu: CpuFacts
    memory: MemoryFacts
    sample: EnvSample  # the changeable part, read at the same moment
    gpu_source: str | None = None  # "nvml", "nvidia-smi" or None (no GPU found)
    server: dict[str, Any] | None = None  # /props's build_info, model_path, total_slots, n_ctx per target
    idle_power_w: dict[str, float] | None = None  # measured before the first level (analysis/energy.py)
    telemetry: tuple[str, ...] = ()  # the exporters read instead of this machine (--telemetry-url)
    # label -> the boot of a server loadgen started (`loadgen grid` adds it after the measurement)
    boot: dict[str, ServerBoot] | None = None
    mac: MacMachine | None = None  # on macOS: the chip, its performance and efficiency cores, memory, macOS

    def to_dict(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)


def fingerprint_from(data: Any) -> Fingerprint | None:
    """A stored fingerprint (run.json's `environment`) back as a record; None when absent or unreadable
    (an older run, or one written by another version: the drift guard then says it cannot tell)."""
    if not isinstance(data, dict):
        return None
    try:
        return msgspec.convert(data, Fingerprint)
    except msgspec.ValidationError:
        return None


def samples_from(data: Any) -> list[EnvSample]:
    """A level's stored `environment` samples back as records (unreadable ones are skipped)."""
    out = []
    for item in data if isinstance(data, list) else []:
        try:
            out.append(msgspec.convert(item, EnvSample))
        except msgspec.ValidationError:
            continue
    return out


STORED_SAMPLES = 100  # the most samples run.json keeps of one level (a long level is thinned evenly)


def thinned(samples: list[EnvSample], limit: int = STORED_SAMPLES) -> list[EnvSample]:
    """At most `limit` of `samples`, evenly spaced, always the first and the last (the energy counters'
    ends). What changed during the level and its energy are computed from all of them before."""
    if len(samples) <= limit:
        return list(samples)
    step = (len(samples) - 1) / (limit - 1)
    return [samples[round(i * step)] for i in range(limit)]
