"""--telemetry-url: Debian's real prometheus-node-exporter reads a built sysfs/procfs tree (its
--path.sysfs/--path.procfs), and loadgen reads the same figures through it as from the tree itself."""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from loadgen.client.telemetry import sample_from_metrics
from machine_tree import build_tree, set_energy
from servers import _missing, free_port, in_process_cli, terminate
from test_env import HWMON, build_hwmon
from test_env_sweep import StandIn, sweep

COLLECTORS = ("cpu", "cpufreq", "rapl", "meminfo", "uname", "os", "hwmon")
OS_RELEASE = 'NAME="Test Linux"\nVERSION_ID="7"\nPRETTY_NAME="Test Linux 7 (tree)"\nID=testlinux\n'


def start_node_exporter(sysfs: Path, procfs: Path, log: Path) -> tuple[subprocess.Popen, str]:
    """node_exporter on a free loopback port reading the tree; (process, its /metrics URL) once it answers."""
    binary = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if binary is None:
        _missing("prometheus-node-exporter", "apt-get install -y prometheus-node-exporter")
    port = free_port()
    rootfs = log.parent / "rootfs"  # the os collector reads <rootfs>/etc/os-release
    (rootfs / "etc").mkdir(parents=True, exist_ok=True)
    (rootfs / "etc/os-release").write_text(OS_RELEASE)
    proc = subprocess.Popen([binary, f"--web.listen-address=127.0.0.1:{port}", f"--path.sysfs={sysfs}",
                             f"--path.rootfs={rootfs}",
                             f"--path.procfs={procfs}", "--collector.disable-defaults",
                             *(f"--collector.{c}" for c in COLLECTORS)],
                            stdout=subprocess.DEVNULL, stderr=log.open("w"))
    url = f"http://127.0.0.1:{port}/metrics"
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if b"node_rapl_package_joules_total" in resp.read():
                    return proc, url
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            terminate(proc)
            raise RuntimeError(f"node_exporter did not answer: {log.read_text()[-2000:]}")
        time.sleep(0.1)


@pytest.fixture
def loadgen(monkeypatch, capsys):
    return in_process_cli(monkeypatch, capsys)


def test_node_exporter_gives_the_figures_the_tree_gives(tmp_path, loadgen):
    sysfs, procfs = build_tree(tmp_path / "m", rapl_uj=123_456_789, steal=3_000, total=200_000,
                               swap_used_kb=1024 * 1024)
    build_hwmon(sysfs)
    proc, url = start_node_exporter(sysfs, procfs, tmp_path / "ne.log")
    try:
        code, direct, err = loadgen("env", "--sysfs", sysfs, "--procfs", procfs, "--interval", "0", "--format", "json")
        assert code == 0, err
        code, remote, err = loadgen("env", "--telemetry-url", url, "--interval", "0", "--format", "json")
        assert code == 0, err
    finally:
        terminate(proc)
    local, far = json.loads(direct)["fingerprint"], json.loads(remote)["fingerprint"]
    assert far["telemetry"] == [url]
    # node_os_info and node_uname_info (the exporter's own uname(2)): the facts a local reading gives
    assert far["os"] == "Test Linux 7 (tree)"
    assert far["kernel"] == platform.release()
    (zone,) = far["sample"]["rapl"]
    assert (zone["name"], zone["energy_uj"]) == ("package-0", local["sample"]["rapl"][0]["energy_uj"])
    assert far["sample"]["cur_mhz_mean"] == local["sample"]["cur_mhz_mean"] == 3000
    assert far["sample"]["cpu_times"] == local["sample"]["cpu_times"] == {"total_jiffies": 200_000,
                                                                          "steal_jiffies": 3_000}
    assert far["sample"]["swap_used_mib"] == local["sample"]["swap_used_mib"] == 1024
    assert far["memory"]["total_mib"] == local["memory"]["total_mib"] == 16384
    assert far["cpu"]["logical_cores"] == 1  # /proc/stat of the tree has one cpuN line
    assert (far["cpu"]["min_mhz"], far["cpu"]["max_mhz"]) == (local["cpu"]["min_mhz"], local["cpu"]["max_mhz"])
    temperatures = [(t["chip"], t["sensor"], t["celsius"]) for t in far["sample"]["temperatures"]]
    assert temperatures == [(t["chip"], t["sensor"], t["celsius"]) for t in local["sample"]["temperatures"]] == HWMON


def test_energy_per_token_through_node_exporter(tmp_path, loadgen):
    """As tests/test_env_sweep.py's exact case, the counter read through node_exporter's RAPL collector."""
    tree = build_tree(tmp_path / "m", rapl_uj=1_000_000)
    energy = {"uj": 1_000_000}

    def spend(n: int) -> None:
        energy["uj"] += 2_000_000
        set_energy(tree[0], energy["uj"])
    proc, url = start_node_exporter(*tree, tmp_path / "ne.log")
    try:
        with StandIn(spend) as server:
            doc = sweep(loadgen, server.origin, tree, tmp_path / "run", "--telemetry-url", url, "--idle-power", "0.2")
    finally:
        terminate(proc)
    assert doc["environment"]["idle_power_w"] == {"cpu": 0.0}
    for level in doc["targets"][0]["levels"]:
        (cpu,) = level["energy"]
        assert cpu["energy_j"] == pytest.approx(12.0) and cpu["j_per_token"] == pytest.approx(0.125)


DCGM_TEXT = """\
# TYPE DCGM_FI_DEV_PCIE_LINK_GEN gauge
DCGM_FI_DEV_PCIE_LINK_GEN{gpu="0",modelName="NVIDIA H100",pci_bus_id="00000000:01:00.0"} 3
DCGM_FI_DEV_PCIE_LINK_WIDTH{gpu="0",modelName="NVIDIA H100",pci_bus_id="00000000:01:00.0"} 16
DCGM_FI_DEV_POWER_USAGE{gpu="0",modelName="NVIDIA H100",pci_bus_id="00000000:01:00.0"} 312.5
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="0",modelName="NVIDIA H100",pci_bus_id="00000000:01:00.0"} 98765
DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{gpu="0",modelName="NVIDIA H100",pci_bus_id="00000000:01:00.0"} 36
"""


def test_dcgm_exporter_text():
    (gpu,) = sample_from_metrics([DCGM_TEXT], 1.0).gpus
    assert (gpu.name, gpu.pcie_gen, gpu.pcie_width, gpu.power_draw_w, gpu.energy_mj) == \
        ("NVIDIA H100", 3, 16, 312.5, 98765)
    assert gpu.throttle_reasons == ("sw_power_cap", "sw_thermal")  # 36 = 0x4 | 0x20
