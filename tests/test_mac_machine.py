"""The Mac's machine in a run's record: the fingerprint and every level's samples carry the chip, its
cores, memory, macOS, the power source, Low Power Mode and the thermal state, and the drift guard
flags a Mac that went to Low Power Mode or got a CPU speed limit, during a level or between sides.

Tested on Linux: the platform is switched in-process and fake `sysctl`, `sw_vers`, `pmset` and
`vm_stat` (shell scripts printing Apple's formats) lead PATH; the fake `pmset` prints files that a
stand-in server rewrites as a chosen request arrives, so the level that request belongs to is the
one whose machine changed (as tests/test_env_sweep.py does with a sysfs tree)."""

from __future__ import annotations

import json
import sys
import sysconfig
from pathlib import Path

import pytest

from loadgen.analysis.env_drift import environment_differences, level_changes, mac_changes, preflight_warnings
from loadgen.client.machine_facts import MachineReader, Roots
from loadgen.core.environment import EnvSample, MacPower
from loadgen.core.errors import EXIT_ENV_CHANGED
from test_env_sweep import StandIn
from test_macos_fallbacks import PMSET_PS, SW_VERS, SYSCTL, THERM_LIMITED, THERM_NONE, VM_STAT

LOW_POWER = {False: "System-wide power settings:\nCurrently in use:\n standby              1\n lowpowermode         0\n",
             True: "System-wide power settings:\nCurrently in use:\n standby              1\n lowpowermode         1\n"}
FAKE_PMSET = """#!/bin/sh
case "$*" in
  "-g") cat "{d}/pmset-g" ;;
  "-g ps") cat "{d}/pmset-ps" ;;
  "-g therm") cat "{d}/pmset-therm" ;;
  *) exit 1 ;;
esac
"""


class FakeMac:
    """A folder of fake macOS tools to put first on PATH; `set(low_power=..., therm=...)` changes what
    the fake pmset prints from then on."""

    def __init__(self, root: Path):
        self.bin = root / "bin"
        self.bin.mkdir(parents=True)
        self.state = root / "state"
        self.state.mkdir()
        for name, text in (("sysctl", SYSCTL), ("sw_vers", SW_VERS), ("vm_stat", VM_STAT)):
            (self.state / name).write_text(text)
            self._script(name, f'#!/bin/sh\ncat "{self.state / name}"\n')
        self._script("pmset", FAKE_PMSET.format(d=self.state))
        (self.state / "pmset-ps").write_text(PMSET_PS)
        self.set(low_power=False, therm=THERM_NONE)

    def _script(self, name: str, text: str) -> None:
        path = self.bin / name
        path.write_text(text)
        path.chmod(0o755)

    def set(self, low_power: bool | None = None, therm: str | None = None) -> None:
        if low_power is not None:
            (self.state / "pmset-g").write_text(LOW_POWER[low_power])
        if therm is not None:
            (self.state / "pmset-therm").write_text(therm)


@pytest.fixture
def mac(tmp_path, monkeypatch):
    fake = FakeMac(tmp_path / "mac")
    monkeypatch.setenv("PATH", f"{fake.bin}:{Path('/bin')}:{Path('/usr/bin')}")
    sysconfig.get_config_vars()  # cached now: with the platform switched it looks for darwin's (scipy asks)
    monkeypatch.setattr(sys, "platform", "darwin")
    return fake


@pytest.fixture
def loadgen(monkeypatch, capsys):
    from servers import in_process_cli
    return in_process_cli(monkeypatch, capsys)


def _sweep(loadgen, url: str, out: Path, empty: Path) -> dict:
    empty.mkdir(exist_ok=True)  # no /proc or /sys, as on a Mac
    code, _, err = loadgen("sweep", "--url", url, "--concurrency", "1,2", "--requests", "6", "--warmup", "0",
                           "--probe-interval", "0", "--sysfs", empty, "--procfs", empty, "--idle-power", "0",
                           "--env-interval", "100", "--output", out, "--format", "json")
    assert code == 0, err
    return json.loads((out / "run.json").read_text())


def test_a_sweep_on_a_mac_records_the_mac_per_level_and_flags_low_power_mode(tmp_path, loadgen, mac):
    # Level 1 (c=1) serves completions 1-6, level 2 (c=2) 7-12: Low Power Mode comes on during level 2.
    with StandIn(lambda n: mac.set(low_power=True) if n == 9 else None) as server:
        doc = _sweep(loadgen, server.origin, tmp_path / "cand", tmp_path / "empty")
    env = doc["environment"]
    assert env["mac"] == {"chip": "Apple M1 Max", "performance_cores": 8, "efficiency_cores": 2,
                          "memory_bytes": 68719476736, "macos": "macOS 14.5 (23F79)",
                          "gpu_model": None, "gpu_cores": None}  # no system_profiler here
    assert env["os"] == "macOS 14.5 (23F79)" and env["cpu"]["model"] == "Apple M1 Max"
    assert env["cpu"]["logical_cores"] == 10 and env["memory"]["total_mib"] == 65536
    assert env["sample"]["mac"] == {"power_source": "AC Power", "low_power_mode": False,
                                    "cpu_speed_limit_pct": 100, "thermal_warning": None}
    first, second = doc["targets"][0]["levels"]
    assert [s["mac"]["low_power_mode"] for s in first["environment"]] == [False, False]
    assert [s["mac"]["low_power_mode"] for s in second["environment"]] == [False, True]
    assert all(s["swap_used_mib"] == 1024 for s in first["environment"] + second["environment"])
    assert first["environment_changed"] == []
    assert len(second["environment_changed"]) == 1
    assert second["environment_changed"][0].startswith("Low Power Mode off → on at ")

    mac.set(low_power=False)
    with StandIn() as server:
        _sweep(loadgen, server.origin, tmp_path / "base", tmp_path / "empty")
    code, out, err = loadgen("compare", tmp_path / "base", tmp_path / "cand")
    assert code == EXIT_ENV_CHANGED, (out, err)
    assert "candidate env-stand-in at level 2: Low Power Mode off → on" in err, err
    assert "env-stand-in Low Power Mode: baseline off; candidate level 2: on" in err, err


def test_a_cpu_speed_limit_between_two_sides_is_a_difference(tmp_path, loadgen, mac):
    with StandIn() as server:
        _sweep(loadgen, server.origin, tmp_path / "base", tmp_path / "empty")
        mac.set(therm=THERM_LIMITED)
        cand = _sweep(loadgen, server.origin, tmp_path / "cand", tmp_path / "empty")
    assert {s["mac"]["cpu_speed_limit_pct"] for lv in cand["targets"][0]["levels"] for s in lv["environment"]} == {70}
    code, out, err = loadgen("compare", tmp_path / "base", tmp_path / "cand")
    assert code == EXIT_ENV_CHANGED, (out, err)
    assert "CPU speed limit (%): baseline 100; candidate 70" in err, err  # at the start of each
    assert "env-stand-in CPU speed limit: baseline 100%; candidate levels 1, 2: 70%" in err, err  # under each level


def test_linux_reads_no_mac(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    reader = MachineReader(Roots(tmp_path, tmp_path))
    assert reader.mac_tools is None
    assert reader.sample(0.0).mac is None and reader.fingerprint().mac is None


def _at(at_s: float, **power) -> EnvSample:
    return EnvSample(at_s=at_s, mac=MacPower(**power))


ON_AC = {"power_source": "AC Power", "low_power_mode": False, "cpu_speed_limit_pct": 100, "thermal_warning": None}


# (samples of one level, what its drift guard says): expected answers written before the rule
@pytest.mark.parametrize("samples,expected", [
    ([_at(0, **ON_AC), _at(5, **ON_AC)], []),
    ([_at(0, **ON_AC), _at(5, **{**ON_AC, "low_power_mode": True})], ["Low Power Mode off → on at 5.0 s"]),
    ([_at(0, **{**ON_AC, "low_power_mode": True}), _at(5, **ON_AC)], ["Low Power Mode on → off at 5.0 s"]),
    ([_at(0, **ON_AC), _at(2, **{**ON_AC, "cpu_speed_limit_pct": 70}), _at(4, **{**ON_AC, "cpu_speed_limit_pct": 50})],
     ["CPU speed limit 100% → 70% at 2.0 s"]),  # said once, at the first sample that shows it
    ([_at(0, **ON_AC), _at(3, **{**ON_AC, "power_source": "Battery Power"})],
     ["power source AC Power → Battery Power at 3.0 s"]),
    ([_at(0, **ON_AC), _at(3, **{**ON_AC, "thermal_warning": "Thermal warning level set to 2."})],
     ["thermal warning at 3.0 s: Thermal warning level set to 2."]),
    ([_at(0, low_power_mode=None), _at(5, low_power_mode=True)], []),  # unknown at the start: no change claimed
    ([_at(0, **ON_AC)], []),
    ([EnvSample(at_s=0), EnvSample(at_s=5)], []),  # Linux samples: nothing of a Mac
])
def test_mac_changes(samples, expected):
    assert mac_changes(samples) == expected
    assert level_changes(samples) == expected


@pytest.mark.parametrize("power,expected", [
    (ON_AC, []),
    ({**ON_AC, "low_power_mode": True}, ["Low Power Mode is on"]),
    ({**ON_AC, "cpu_speed_limit_pct": 70}, ["the CPU speed limit is 70%"]),
    ({**ON_AC, "power_source": "Battery Power"}, ["the Mac runs on battery"]),
])
def test_preflight_on_a_mac(power, expected):
    from loadgen.core.environment import CpuFacts, Fingerprint, MemoryFacts
    fp = Fingerprint(loadgen="x", python="3", os="macOS 14.5", kernel=None, cpu=CpuFacts(model=None, logical_cores=10),
                     memory=MemoryFacts(total_mib=None, available_mib=None, swap_total_mib=None, swap_used_mib=None),
                     sample=_at(0, **power))
    warnings = preflight_warnings(fp)
    assert [w for w in warnings if any(w.startswith(e) for e in expected)] == warnings and len(warnings) == len(expected)


def test_two_linux_sides_say_nothing_of_a_mac():
    from loadgen.core.environment import CpuFacts, Fingerprint, MemoryFacts
    fp = Fingerprint(loadgen="x", python="3", os="Debian", kernel="6.1", cpu=CpuFacts(model="x", logical_cores=2),
                     memory=MemoryFacts(total_mib=1, available_mib=1, swap_total_mib=0, swap_used_mib=0),
                     sample=EnvSample(at_s=0))
    doc = {"schema_version": 4, "environment": fp.to_dict(), "targets": []}
    assert environment_differences([doc], [doc]) == ([], [])
