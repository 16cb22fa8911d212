"""Build sysfs/procfs trees for the environment tests: the files client/machine_facts.py reads, with
values a test chooses (and changes mid-run), as node_exporter's fixtures do for --path.sysfs."""

from __future__ import annotations

from pathlib import Path

GT_S = {1: "2.5 GT/s PCIe", 2: "5.0 GT/s PCIe", 3: "8.0 GT/s PCIe", 4: "16.0 GT/s PCIe", 5: "32.0 GT/s PCIe"}


def _write(path: Path, text: str) -> None:
    """`text` replaced whole: a sampler reading the tree while a test changes it never sees the file
    empty (the kernel's never are; a partial read once gave a link change of "Gen?" beside the real one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(path.name + ".new")
    staged.write_text(text + "\n")
    staged.replace(path)


def build_tree(root: Path, *, cores: int = 4, governor: str = "performance", swap_used_kb: int = 0,
               steal: int = 0, total: int = 100_000, gpu_link: tuple[int, int] | None = None,
               gpu_max: tuple[int, int] = (4, 16), rapl_uj: int | None = None,
               rapl_limit_w: float = 125.0, rapl_max_w: float = 125.0) -> tuple[Path, Path]:
    """(sysfs, procfs) under `root`: `cores` CPUs at 3 GHz (1–4 GHz) under `governor`; a GPU-class
    PCI device at 0000:01:00.0 with link `gpu_link` (gen, width) of `gpu_max` when given; RAPL
    package-0 at `rapl_uj` µJ when given; /proc/stat's cpu line with `total` jiffies, `steal` stolen."""
    sysfs, procfs = root / "sys", root / "proc"
    _write(procfs / "cpuinfo", "\n".join(f"processor\t: {i}\nmodel name\t: Test CPU 9000\n" for i in range(cores)))
    _write(procfs / "meminfo", f"MemTotal:       16777216 kB\nMemAvailable:    8388608 kB\n"
                               f"SwapTotal:       4194304 kB\nSwapFree:        {4194304 - swap_used_kb} kB")
    set_cpu_times(procfs, total=total, steal=steal)
    _write(procfs / "sys/kernel/osrelease", "6.1.0-test")
    for i in range(cores):
        d = sysfs / f"devices/system/cpu/cpu{i}/cpufreq"
        _write(d / "scaling_governor", governor)
        _write(d / "cpuinfo_min_freq", "1000000")
        _write(d / "cpuinfo_max_freq", "4000000")
        _write(d / "scaling_cur_freq", "3000000")
        # The rest of what node_exporter's cpufreq collector reads (the --telemetry-url test).
        _write(d / "cpuinfo_cur_freq", "3000000")
        _write(d / "scaling_min_freq", "1000000")
        _write(d / "scaling_max_freq", "4000000")
        _write(d / "scaling_available_governors", "performance powersave")
        _write(d / "scaling_driver", "test")
        _write(d / "related_cpus", str(i))
        _write(d / "scaling_setspeed", "<unsupported>")
        _write(d / "cpuinfo_transition_latency", "0")
    _write(sysfs / "devices/system/cpu/intel_pstate/no_turbo", "0")
    bridge = sysfs / "bus/pci/devices/0000:00:01.0"  # a bridge idling at Gen1: never a warning
    _write(bridge / "class", "0x060400")
    for name, value in (("current_link_speed", GT_S[1]), ("max_link_speed", GT_S[4]),
                        ("current_link_width", "1"), ("max_link_width", "16")):
        _write(bridge / name, value)
    if gpu_link is not None:
        _write(sysfs / "bus/pci/devices/0000:01:00.0/class", "0x030200")
        set_link(sysfs, *gpu_link, max_gen=gpu_max[0], max_width=gpu_max[1])
    if rapl_uj is not None:
        z = sysfs / "class/powercap/intel-rapl:0"
        _write(z / "name", "package-0")
        _write(z / "max_energy_range_uj", str(262143328850))
        _write(z / "constraint_0_name", "long_term")
        _write(z / "constraint_0_power_limit_uw", str(int(rapl_limit_w * 1e6)))
        _write(z / "constraint_0_max_power_uw", str(int(rapl_max_w * 1e6)))
        set_energy(sysfs, rapl_uj)
    return sysfs, procfs


def set_link(sysfs: Path, gen: int, width: int, max_gen: int = 4, max_width: int = 16) -> None:
    d = sysfs / "bus/pci/devices/0000:01:00.0"
    _write(d / "current_link_speed", GT_S[gen])
    _write(d / "current_link_width", str(width))
    _write(d / "max_link_speed", GT_S[max_gen])
    _write(d / "max_link_width", str(max_width))


def set_energy(sysfs: Path, uj: int) -> None:
    """The counter at `uj`, replaced whole (a reader never sees the file empty, as the kernel's never is:
    a soak's sampler reads it while hundreds of requests a second advance it)."""
    _write(sysfs / "class/powercap/intel-rapl:0/energy_uj", str(uj))


def set_cpu_times(procfs: Path, total: int, steal: int) -> None:
    user = total - steal  # user nice system idle iowait irq softirq steal guest guest_nice
    _write(procfs / "stat", f"cpu  {user} 0 0 0 0 0 0 {steal} 0 0\ncpu0 {user} 0 0 0 0 0 0 {steal} 0 0\n"
                            "intr 0\nctxt 0\nbtime 0\nprocesses 0\nprocs_running 1\nprocs_blocked 0")


def set_rapl_limit(sysfs: Path, watts: float) -> None:
    _write(sysfs / "class/powercap/intel-rapl:0/constraint_0_power_limit_uw", str(int(watts * 1e6)))


def set_temperature(sysfs: Path, hwmon: int, k: int, celsius: float, *, chip: str | None = None,
                    label: str | None = None) -> None:
    """hwmon`hwmon`'s temp`k`_input at `celsius` (in m°C, as the kernel writes it), its chip's `name`
    and the sensor's label when given."""
    d = sysfs / f"class/hwmon/hwmon{hwmon}"
    _write(d / f"temp{k}_input", str(round(celsius * 1000)))
    if chip is not None:
        _write(d / "name", chip)
    if label is not None:
        _write(d / f"temp{k}_label", label)
