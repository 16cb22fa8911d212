"""The machine of a remote server, from the Prometheus exporters already running beside it (`--telemetry-url`).

Prometheus node_exporter gives the host (its collectors `cpu`, `cpufreq`, `rapl`, `meminfo`, `uname`,
`os`, `hwmon`; the OS from node_os_info and the kernel from node_uname_info, see `facts_from_metrics`),
NVIDIA's DCGM exporter the GPUs; each URL is scraped (a GET of its /metrics text) and the figures of
all of them are merged into one `EnvSample`, the same record as a local sysfs reading, so the drift
guard and energy per token work unchanged. `sample_from_metrics` is the pure part (text in, record
out); `TelemetryReader` fetches.

node_exporter metric -> field:
    node_rapl_<zone>_joules_total{index="N"}     -> RaplZone("intel-rapl:N", "<zone>-N", energy_uj = J × 1e6)
    node_cpu_scaling_frequency_hertz{cpu}        -> cur_mhz_mean (mean over CPUs)
    node_cpu_scaling_governor{governor} == 1     -> governors (node_exporter ≥ 1.6)
    node_cpu_seconds_total{cpu,mode}             -> cpu_times (× 100: USER_HZ jiffies; steal = mode "steal")
    node_memory_Swap{Total,Free}_bytes           -> swap_used_mib
    node_hwmon_temp_celsius{chip,sensor}         -> temperatures (Temperature: the chip's name from
        node_hwmon_chip_names{chip_name}, the sensor's from node_hwmon_sensor_label{label}, as the
        local reading names them from the `name` and `tempK_label` files)
DCGM exporter metric (label `gpu`) -> GpuFacts:
    DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION (mJ), DCGM_FI_DEV_POWER_USAGE (W), DCGM_FI_DEV_POWER_MGMT_LIMIT (W),
    DCGM_FI_DEV_SM_CLOCK, DCGM_FI_DEV_MEM_CLOCK (MHz), DCGM_FI_DEV_GPU_TEMP (°C), DCGM_FI_DEV_FB_USED (MiB),
    DCGM_FI_DEV_PCIE_LINK_GEN, DCGM_FI_DEV_PCIE_LINK_WIDTH, DCGM_FI_DEV_CLOCK_THROTTLE_REASONS (bit mask)
    (the GPU's name from the `modelName` label).
"""

from __future__ import annotations

import re
import urllib.parse
import urllib.request
from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families

from ..core.environment import CpuFacts, CpuTimes, EnvSample, GpuFacts, MemoryFacts, RaplZone, Temperature
from .machine_facts import THROTTLE_BITS, sorted_temperatures

USER_HZ = 100  # node_exporter divides /proc/stat's jiffies by it
_RAPL = re.compile(r"node_rapl_(\w+?)_joules_total")
DCGM = {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "energy_mj", "DCGM_FI_DEV_POWER_USAGE": "power_draw_w",
        "DCGM_FI_DEV_POWER_MGMT_LIMIT": "power_limit_w", "DCGM_FI_DEV_SM_CLOCK": "sm_clock_mhz",
        "DCGM_FI_DEV_MEM_CLOCK": "mem_clock_mhz", "DCGM_FI_DEV_GPU_TEMP": "temperature_c",
        "DCGM_FI_DEV_FB_USED": "memory_used_mib", "DCGM_FI_DEV_PCIE_LINK_GEN": "pcie_gen",
        "DCGM_FI_DEV_PCIE_LINK_WIDTH": "pcie_width"}
INT_FIELDS = {"energy_mj", "sm_clock_mhz", "mem_clock_mhz", "temperature_c", "memory_used_mib", "pcie_gen",
              "pcie_width"}
FETCH_TIMEOUT_S = 5
READ_PREFIXES = ("node_", "DCGM_FI_DEV_")  # the exporters' metrics read here (node_exporter's, DCGM's)


def reads_nothing(text: str) -> bool:
    """Whether an exposition text holds no metric of node_exporter or the DCGM exporter (another
    program's /metrics, a llama-server's): nothing of the machine would be read from it."""
    try:
        return not any(f.name.startswith(READ_PREFIXES) for f in text_string_to_metric_families(text))
    except ValueError:
        return True


def sample_from_metrics(texts: list[str], at_s: float) -> EnvSample:
    """One sample from the exposition texts of one machine's exporters (node_exporter, DCGM exporter)."""
    rapl, freqs, governors = [], [], set()
    cpu_seconds: dict[str, float] = defaultdict(float)
    memory: dict[str, float] = {}
    gpus: dict[int, dict] = {}
    hwmon = _Hwmon()
    for text in texts:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                name, labels, value = s.name, s.labels, s.value
                if name.startswith("node_hwmon_"):
                    hwmon.add(name, labels, value)
                    continue
                m = _RAPL.fullmatch(name)
                if m:
                    index = labels.get("index", "0")
                    rapl.append(RaplZone(zone=f"intel-rapl:{index}", name=f"{m.group(1)}-{index}",
                                         energy_uj=round(value * 1e6), max_energy_range_uj=None))
                elif name == "node_cpu_scaling_frequency_hertz":
                    freqs.append(value / 1e6)
                elif name == "node_cpu_scaling_governor" and value == 1:
                    governors.add(labels.get("governor", "?"))
                elif name == "node_cpu_seconds_total":
                    cpu_seconds[labels.get("mode", "")] += value
                elif name in ("node_memory_SwapTotal_bytes", "node_memory_SwapFree_bytes"):
                    memory[name] = value
                elif name in DCGM or name == "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS":
                    gpu = gpus.setdefault(int(labels.get("gpu", "0")), {"name": labels.get("modelName") or "GPU",
                                                                          "bus_id": labels.get("pci_bus_id")})
                    if name == "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS":
                        mask = int(value)
                        gpu["throttle_reasons"] = tuple(r for bit, r in THROTTLE_BITS.items() if mask & bit and bit != 1)
                    else:
                        field = DCGM[name]
                        gpu[field] = int(value) if field in INT_FIELDS else float(value)
    times = None
    if cpu_seconds:
        modes = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
        times = CpuTimes(total_jiffies=round(sum(cpu_seconds.get(m, 0.0) for m in modes) * USER_HZ),
                         steal_jiffies=round(cpu_seconds.get("steal", 0.0) * USER_HZ))
    swap = None
    if len(memory) == 2:
        swap = int(memory["node_memory_SwapTotal_bytes"] - memory["node_memory_SwapFree_bytes"]) // 2**20
    return EnvSample(at_s=at_s, governors=tuple(sorted(governors)),
                     cur_mhz_mean=sum(freqs) / len(freqs) if freqs else None, rapl=tuple(rapl), cpu_times=times,
                     swap_used_mib=swap,
                     gpus=tuple(GpuFacts(index=i, source="dcgm-exporter", **g) for i, g in sorted(gpus.items())),
                     temperatures=hwmon.temperatures())


class _Hwmon:
    """node_exporter's hwmon collector: temperatures by (chip, sensor), and the names it gives them."""

    def __init__(self) -> None:
        self.celsius: dict[tuple[str, str], float] = {}
        self.labels: dict[tuple[str, str], str] = {}
        self.chip_names: dict[str, str] = {}

    def add(self, name: str, labels: dict[str, str], value: float) -> None:
        key = (labels.get("chip", ""), labels.get("sensor", ""))
        if name == "node_hwmon_temp_celsius":
            self.celsius[key] = value
        elif name == "node_hwmon_sensor_label" and labels.get("label"):
            self.labels[key] = labels["label"]
        elif name == "node_hwmon_chip_names" and labels.get("chip_name"):
            self.chip_names[key[0]] = labels["chip_name"]

    def temperatures(self) -> tuple[Temperature, ...]:
        found = []
        for (chip, sensor), celsius in self.celsius.items():
            name = self.chip_names.get(chip, chip)
            k = int(sensor[4:]) if sensor[4:].isdigit() else -1
            found.append((name, k, Temperature(chip=name, sensor=self.labels.get((chip, sensor), sensor),
                                               celsius=celsius)))
        return sorted_temperatures(found)


def facts_from_metrics(texts: list[str]) -> tuple[str | None, str | None, CpuFacts, MemoryFacts]:
    """(OS, kernel, CPU, memory) of the exporters' machine: node_os_info's `pretty_name` (as the local
    reading's os-release PRETTY_NAME; else `name` and `version_id`), node_uname_info's `release`, node_cpu_info's
    `model_name` (node_exporter --collector.cpu.info), the CPUs of node_cpu_seconds_total,
    node_cpu_frequency_{min,max}_hertz, node_memory_{MemTotal,MemAvailable,SwapTotal,SwapFree}_bytes."""
    os_name, kernel, model, cpus, mins, maxs, mem = None, None, None, set(), [], [], {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "node_uname_info":
                    kernel = s.labels.get("release") or kernel
                elif s.name == "node_os_info":
                    named = " ".join(v for v in (s.labels.get("name"), s.labels.get("version_id")) if v)
                    os_name = s.labels.get("pretty_name") or named or os_name
                elif s.name == "node_cpu_info":
                    model = s.labels.get("model_name") or model
                elif s.name == "node_cpu_seconds_total":
                    cpus.add(s.labels.get("cpu"))
                elif s.name == "node_cpu_frequency_min_hertz":
                    mins.append(s.value / 1e6)
                elif s.name == "node_cpu_frequency_max_hertz":
                    maxs.append(s.value / 1e6)
                elif s.name.startswith("node_memory_") and s.name.endswith("_bytes"):
                    mem[s.name[len("node_memory_"):-len("_bytes")]] = s.value

    def mib(key: str) -> int | None:
        return int(mem[key]) // 2**20 if key in mem else None
    swap_used = int(mem["SwapTotal"] - mem["SwapFree"]) // 2**20 if {"SwapTotal", "SwapFree"} <= mem.keys() else None
    return os_name, kernel, CpuFacts(model=model, logical_cores=len(cpus), min_mhz=min(mins, default=None),
                            max_mhz=max(maxs, default=None)), \
        MemoryFacts(total_mib=mib("MemTotal"), available_mib=mib("MemAvailable"), swap_total_mib=mib("SwapTotal"),
                    swap_used_mib=swap_used)


class TelemetryError(Exception):
    """An exporter did not answer; the message names it."""


class TelemetryReader:
    """Scrapes the exporters at `urls` (a /metrics URL each; a bare host:port gets /metrics)."""

    def __init__(self, urls: tuple[str, ...]):
        self.urls = tuple(u if "://" in u else f"http://{u}" for u in urls)
        self.urls = tuple(u if urllib.parse.urlsplit(u).path not in ("", "/") else u.rstrip("/") + "/metrics"
                          for u in self.urls)
        self.last: dict[str, str] = {}  # url -> the text it gave last

    def texts(self) -> list[str]:
        for url in self.urls:
            try:
                with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as resp:  # noqa: S310 (the user's URL)
                    self.last[url] = resp.read().decode("utf-8", errors="replace")
            except (OSError, ValueError) as exc:
                raise TelemetryError(f"--telemetry-url {url}: no answer ({exc})") from None
        return [self.last[url] for url in self.urls]

    def foreign(self) -> list[str]:
        """The URLs whose last answer held no node_exporter or DCGM exporter metric (`reads_nothing`)."""
        return [url for url, text in self.last.items() if reads_nothing(text)]

    def sample(self, at_s: float) -> EnvSample:
        return sample_from_metrics(self.texts(), at_s)

    def facts(self) -> tuple[str | None, str | None, CpuFacts, MemoryFacts]:
        return facts_from_metrics(self.texts())
