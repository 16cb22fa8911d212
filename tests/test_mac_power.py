"""Apple Silicon's GPU cores (system_profiler) and power and energy (powermetrics, which needs root).

The parsers are fed outputs in the formats the tools print (powermetrics' power lines as pasted in
public reports: asitop's and joularjx's issues; system_profiler's SPDisplaysDataType JSON); the runs
put fake `system_profiler`, `powermetrics` and `sudo` first on PATH with the platform switched, and
`os.geteuid` says whether loadgen is root."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import test_mac_machine
from loadgen.analysis.energy import counters_j, idle_power, level_energy
from loadgen.client import mac_facts, mac_power
from loadgen.core.environment import EnvSample, MacEnergy
from test_env_sweep import StandIn

mac = pytest.fixture(test_mac_machine.mac.__wrapped__)  # the fake Mac's tools first on PATH, the platform darwin
loadgen = pytest.fixture(test_mac_machine.loadgen.__wrapped__)

# macOS 13 and later (Ventura on): each sampler's section, then the three powers and their sum.
POWERMETRICS_13 = """Machine model: MacBookPro18,4
OS version: 23B81

*** Sampled system activity (Tue Nov 28 14:37:01 2023 +0100) (204.50ms elapsed) ***

**** Processor usage ****

E-Cluster HW active frequency: 1578 MHz
P0-Cluster HW active frequency: 3077 MHz

CPU Power: 1234 mW
GPU Power: 56 mW
ANE Power: 0 mW
Combined Power (CPU + GPU + ANE): 1290 mW

**** GPU usage ****

GPU HW active frequency: 389 MHz
GPU HW active residency:   4.13% (389 MHz: 4.1%)
GPU idle residency:  95.87%
GPU Power: 56 mW
"""
# macOS 12 (Monterey, asitop's era): no combined line, "Package Power" instead.
POWERMETRICS_12 = """**** Processor usage ****

ANE Power: 12 mW
CPU Power: 4321 mW
GPU Power: 7890 mW
Package Power: 12300 mW
"""
DISPLAYS_M1_MAX = json.dumps({"SPDisplaysDataType": [{
    "_name": "Apple M1 Max", "spdisplays_mtlgpufamilysupport": "spdisplays_metal3",
    "spdisplays_ndrvs": [{"_name": "Color LCD", "spdisplays_main": "spdisplays_yes"}],
    "spdisplays_vendor": "sppci_vendor_Apple", "sppci_bus": "spdisplays_builtin", "sppci_cores": "32",
    "sppci_device_type": "spdisplays_gpu", "sppci_model": "Apple M1 Max"}]}, indent=2)
DISPLAYS_INTEL = json.dumps({"SPDisplaysDataType": [
    {"_name": "Intel UHD Graphics 630", "sppci_model": "Intel UHD Graphics 630", "spdisplays_vram": "1536 MB"},
    {"_name": "AMD Radeon Pro 5500M", "sppci_model": "AMD Radeon Pro 5500M", "spdisplays_vram": "4 GB"}]})


@pytest.mark.parametrize("text, expected", [
    (POWERMETRICS_13, {"cpu_mw": 1234.0, "gpu_mw": 56.0, "ane_mw": 0.0, "combined_mw": 1290.0}),
    (POWERMETRICS_12, {"cpu_mw": 4321.0, "gpu_mw": 7890.0, "ane_mw": 12.0}),
    ("CPU Power: 1.5 W\nGPU Power: 0.25 W\n", {"cpu_mw": 1500.0, "gpu_mw": 250.0}),
    # an Intel Mac's powermetrics states no Apple Silicon power
    ("Intel energy model derived package power (CPUs+GPU+ANE): 3.42W\n", {}),
    ("powermetrics must be invoked as the superuser\n", {}),
    ("", {}),
])
def test_powermetrics_powers(text, expected):
    assert mac_facts.parse_powermetrics(text) == expected


@pytest.mark.parametrize("text, expected", [
    (DISPLAYS_M1_MAX, ("Apple M1 Max", 32)),
    (DISPLAYS_INTEL, ("Intel UHD Graphics 630", None)),  # no Apple GPU: no core count
    ('{"SPDisplaysDataType": []}', (None, None)),
    ("not json", (None, None)),
    ("", (None, None)),
])
def test_system_profiler_gpu(text, expected):
    assert mac_facts.parse_displays(text) == expected


def test_the_gpu_in_the_fingerprint_and_env_lines():
    def tools(argv):
        return DISPLAYS_M1_MAX if argv[0] == "system_profiler" else None
    machine = mac_facts.read_mac_machine(tools)
    assert (machine.gpu_model, machine.gpu_cores) == ("Apple M1 Max", 32)
    facts = mac_facts.read_mac_facts(tools)
    assert mac_facts.mac_lines(facts)[:2] == ["Mac: unknown chip", "GPU: Apple M1 Max, 32 cores"]
    assert "GPU:" not in " ".join(mac_facts.mac_lines(mac_facts.read_mac_facts(lambda argv: None)))


def _readings(*texts):
    it = iter(texts)
    return lambda argv: next(it)


def test_the_meter_integrates_power_into_joules():
    meter = mac_power.PowerMeter(["powermetrics"], _readings("CPU Power: 1000 mW\nGPU Power: 4000 mW\n",
                                                             "CPU Power: 3000 mW\nGPU Power: 4000 mW\n",
                                                             "nothing", "CPU Power: 3000 mW\n"))
    assert meter.read(0.0) == MacEnergy(cpu_mw=1000, gpu_mw=4000, cpu_j=0, gpu_j=0)
    assert meter.read(2.0) == MacEnergy(cpu_mw=3000, gpu_mw=4000, cpu_j=4.0, gpu_j=8.0)  # (1+3)/2 W × 2 s
    assert meter.read(3.0) is None  # no power printed: that reading is left out
    assert meter.read(4.0) == MacEnergy(cpu_mw=3000, cpu_j=10.0, gpu_j=8.0)


@pytest.mark.parametrize("euid, works, argv0, note", [
    (0, {"powermetrics"}, "powermetrics", None),
    (501, {"sudo"}, "sudo", None),
    (501, set(), None, mac_power.ROOT_NOTE),
    (0, set(), None, "powermetrics gave no power reading (is it an Apple Silicon Mac?); energy per token is not measured"),
])
def test_how_powermetrics_is_run(euid, works, argv0, note):
    def tools(argv):
        return POWERMETRICS_13 if argv[0] in works else None
    meter, said = mac_power.power_meter(tools, euid=euid)
    assert said == note
    assert (meter.argv[0] if meter else None) == argv0
    if argv0 == "sudo":
        assert meter is not None and meter.argv[:3] == ["sudo", "-n", "powermetrics"]


def test_energy_per_token_from_powermetrics_gross_and_net():
    def at(t, cpu_j, gpu_j, ane_j):
        return EnvSample(at_s=t, mac_energy=MacEnergy(cpu_j=cpu_j, gpu_j=gpu_j, ane_j=ane_j))
    assert counters_j(at(0, 1.0, 2.0, 0.0)) == {"cpu": {"powermetrics": (1.0, None)},
                                                "gpu": {"powermetrics": (2.0, None)},
                                                "ane": {"powermetrics": (0.0, None)}}
    idle = idle_power([at(0, 0, 0, 0), at(2, 2.0, 1.0, 0)])  # 1 W CPU, 0.5 W GPU at idle
    assert idle == {"cpu": 1.0, "gpu": 0.5, "ane": 0.0}
    rows = {e.source: e for e in level_energy([at(10, 10, 5, 0), at(20, 60, 105, 0)], 100, idle)}
    assert rows["cpu"].energy_j == 50 and rows["cpu"].j_per_token == 0.5 and rows["cpu"].net_j_per_token == 0.4
    assert rows["gpu"].mean_w == 10 and rows["gpu"].net_energy_j == 95
    assert rows["total"].energy_j == 150 and rows["total"].net_energy_j == 135 and rows["total"].j_per_token == 1.5
    assert counters_j(EnvSample(at_s=0)) == {}  # Linux's samples: no Mac source


FAKE_POWERMETRICS = '#!/bin/sh\ncat "{state}/powermetrics"\n'
FAKE_SUDO_DENIED = '#!/bin/sh\necho "sudo: a password is required" >&2\nexit 1\n'
IDLE = "CPU Power: 500 mW\nGPU Power: 100 mW\nANE Power: 0 mW\nCombined Power (CPU + GPU + ANE): 600 mW\n"
BUSY = "CPU Power: 2500 mW\nGPU Power: 12100 mW\nANE Power: 0 mW\nCombined Power (CPU + GPU + ANE): 14600 mW\n"


def _tools(mac, monkeypatch, euid: int, sudo: str | None = None) -> None:
    mac._script("system_profiler", f"#!/bin/sh\ncat <<'END'\n{DISPLAYS_M1_MAX}\nEND\n")
    (mac.state / "powermetrics").write_text(IDLE)
    mac._script("powermetrics", FAKE_POWERMETRICS.format(state=mac.state))
    mac._script("sudo", sudo or '#!/bin/sh\n[ "$1" = "-n" ] && shift\nexec "$@"\n')
    monkeypatch.setattr(os, "geteuid", lambda: euid)


def _sweep_idle(loadgen, url: str, out: Path, empty: Path) -> tuple[dict, str]:
    empty.mkdir(exist_ok=True)
    code, _, err = loadgen("sweep", "--url", url, "--concurrency", "1,2", "--requests", "6", "--warmup", "0",
                           "--probe-interval", "0", "--sysfs", empty, "--procfs", empty, "--idle-power", "0.3",
                           "--env-interval", "100", "--output", out, "--format", "json")
    assert code == 0, err
    return json.loads((out / "run.json").read_text()), err


@pytest.mark.parametrize("euid", [0, 501])  # as root, and through a sudo that asks no password
def test_a_sweep_on_a_mac_has_energy_per_token_from_powermetrics(tmp_path, loadgen, mac, monkeypatch, euid):
    _tools(mac, monkeypatch, euid)
    with StandIn(lambda n: (mac.state / "powermetrics").write_text(BUSY) if n == 1 else None) as server:
        doc, err = _sweep_idle(loadgen, server.origin, tmp_path / "run", tmp_path / "empty")
    assert "powermetrics" not in err, err
    env = doc["environment"]
    assert (env["mac"]["gpu_model"], env["mac"]["gpu_cores"]) == ("Apple M1 Max", 32)
    assert env["idle_power_w"] == pytest.approx({"cpu": 0.5, "gpu": 0.1, "ane": 0.0}, abs=1e-4)
    assert env["sample"]["mac_energy"]["combined_mw"] == 600
    for level in doc["targets"][0]["levels"]:
        rows = {e["source"]: e for e in level["energy"]}
        assert set(rows) == {"cpu", "gpu", "ane", "total"}
        tokens = rows["total"]["energy_j"] / rows["total"]["j_per_token"]
        assert tokens > 0
        assert rows["total"]["net_j_per_token"] == pytest.approx(
            (rows["total"]["energy_j"] - 0.6 * rows["total"]["seconds"]) / tokens, rel=1e-3)
    # level 1 went from idle (its first sample) to busy (its last): the trapezoid's mean; level 2 busy throughout
    first, second = ({e["source"]: e["mean_w"] for e in lv["energy"]} for lv in doc["targets"][0]["levels"])
    assert first == pytest.approx({"cpu": 1.5, "gpu": 6.1, "ane": 0.0, "total": 7.6}, abs=1e-3)
    assert second == pytest.approx({"cpu": 2.5, "gpu": 12.1, "ane": 0.0, "total": 14.6}, abs=1e-3)


def test_without_root_the_sweep_says_so_once_and_has_no_energy(tmp_path, loadgen, mac, monkeypatch):
    _tools(mac, monkeypatch, 501, sudo=FAKE_SUDO_DENIED)
    with StandIn() as server:
        doc, err = _sweep_idle(loadgen, server.origin, tmp_path / "run", tmp_path / "empty")
    assert err.count("powermetrics needs root") == 1, err
    assert f"note: {mac_power.ROOT_NOTE}" in err
    assert "idle_power_w" not in doc["environment"] or not doc["environment"]["idle_power_w"]
    for level in doc["targets"][0]["levels"]:
        assert not level.get("energy")
        assert all(s["mac_energy"] is None for s in level["environment"])


def test_env_on_a_mac_prints_the_gpu_and_the_power_draw(tmp_path, loadgen, mac, monkeypatch):
    _tools(mac, monkeypatch, 0)
    code, out, err = loadgen("env", "--interval", "0")
    assert code == 0, err
    assert "GPU: Apple M1 Max, 32 cores" in out
    assert "power draw: CPU 500 mW, GPU 100 mW, ANE 0 mW (powermetrics)" in out
    _tools(mac, monkeypatch, 501, sudo=FAKE_SUDO_DENIED)
    code, out, err = loadgen("env", "--interval", "0")
    assert code == 0, err
    assert f"power draw: {mac_power.ROOT_NOTE}" in out
