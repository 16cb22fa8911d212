"""A Mac's memory pressure and swap per level: every sample of a run on a Mac carries the kernel's
memory pressure level (`sysctl kern.memorystatus_vm_pressure_level`) and vm_stat's free, compressed
and swapped pages, and the drift guard flags a level during which the pressure rose or the Mac swapped,
as it flags Low Power Mode switched on (tests/test_mac_machine.py).

Tested on Linux with the platform switched and fake `sysctl` and `vm_stat` first on PATH (the fake Mac of
tests/test_mac_machine.py); a stand-in server rewrites what they print as a chosen request arrives."""

from __future__ import annotations

import pytest

import test_mac_machine
from loadgen.analysis.env_drift import level_changes, mac_memory_changes, preflight_warnings
from loadgen.client import mac_facts
from loadgen.core.environment import CpuFacts, EnvSample, Fingerprint, MacMemory, MacPower, MemoryFacts
from test_env_sweep import StandIn
from test_mac_machine import _sweep
from test_macos_fallbacks import SYSCTL

mac = pytest.fixture(test_mac_machine.mac.__wrapped__)  # the fake Mac's tools first on PATH, the platform darwin
loadgen = pytest.fixture(test_mac_machine.loadgen.__wrapped__)

# vm_stat as macOS 14 prints it on Apple Silicon (every line, in its order; the counts are one machine's).
VM_STAT_M1 = """Mach Virtual Memory Statistics: (page size of 16384 bytes)
Pages free:                                3739.
Pages active:                            395047.
Pages inactive:                          392410.
Pages speculative:                         2335.
Pages throttled:                              0.
Pages wired down:                        173453.
Pages purgeable:                           6420.
"Translation faults":                1197698466.
Pages copy-on-write:                   48138564.
Pages zero filled:                    570066542.
Pages reactivated:                     35718036.
Pages purged:                           4829829.
File-backed pages:                       229447.
Anonymous pages:                         560345.
Pages stored in compressor:             1517440.
Pages occupied by compressor:            533869.
Decompressions:                        60428932.
Compressions:                          80155307.
Pageins:                               27251519.
Pageouts:                                373735.
Swapins:                                4113562.
Swapouts:                               4791178.
"""


def test_vm_stat_and_the_pressure_level_as_memory():
    assert mac_facts.vm_stat_memory(VM_STAT_M1, 2) == MacMemory(
        pressure_level=2, free_mib=58.4, compressed_mib=8341.7,  # 3739 and 533869 pages of 16 KiB
        swapped_in_mib=64274.4, swapped_out_mib=74862.2)  # 4113562 and 4791178 pages of 16 KiB
    assert MacMemory(pressure_level=2).pressure == "warning"
    assert MacMemory(pressure_level=4).pressure == "critical" and MacMemory(pressure_level=8).pressure == "level 8"
    assert mac_facts.vm_stat_memory("") == MacMemory()  # no vm_stat: unknowns


def _at(at_s: float, swap: int | None, level: int | None, out: float | None) -> EnvSample:
    return EnvSample(at_s=at_s, swap_used_mib=swap, mac=MacPower(),
                     mac_memory=MacMemory(pressure_level=level, swapped_out_mib=out))


# (one level's samples: (at_s, swap used MiB, pressure level, MiB swapped out since boot), what the
# drift guard says): the expected answers were written before the rule.
@pytest.mark.parametrize("samples,expected", [
    ([_at(0, 1024, 1, 500), _at(5, 1024, 1, 500)], []),
    ([_at(0, 1024, 1, 500), _at(3, 1024, 2, 500), _at(6, 1024, 4, 500)],
     ["memory pressure normal → warning at 3.0 s"]),  # said once, at the first sample that shows it
    ([_at(0, 1024, 2, 500), _at(5, 1024, 1, 500)], []),  # the pressure fell: nothing spoiled the level
    ([_at(0, 1024, 1, 500), _at(4, 1600, 1, 1100)], ["swapping at 4.0 s: swap used 1024 → 1600 MiB, 600 MiB swapped out"]),
    ([_at(0, 1024, 1, 500), _at(4, 1056, 1, 532)], []),  # 32 MiB: below SWAP_GROWTH_MIB
    ([_at(0, 1024, 1, 500), _at(4, 1024, 1, 700)],  # swap used steady, pages out and back in
     ["swapping at 4.0 s: swap used 1024 → 1024 MiB, 200 MiB swapped out"]),
    ([_at(0, None, 1, 500), _at(4, None, 1, 600)], ["swapping at 4.0 s: 100 MiB swapped out"]),
    ([_at(0, 1024, 1, 500), _at(2, 1024, 2, 500), _at(4, 2048, 2, 1600)],
     ["memory pressure normal → warning at 2.0 s", "swapping at 4.0 s: swap used 1024 → 2048 MiB, 1100 MiB swapped out"]),
    ([_at(0, 1024, None, 500), _at(4, 1024, 4, 500)], []),  # pressure unknown at the start: no rise claimed
    ([_at(0, 1024, 1, 500)], []),
    ([EnvSample(at_s=0, swap_used_mib=0), EnvSample(at_s=5, swap_used_mib=2000)], []),  # Linux: as before
])
def test_mac_memory_changes(samples, expected):
    assert mac_memory_changes(samples) == expected
    assert level_changes(samples) == expected


@pytest.mark.parametrize("level,expected", [(1, []), (None, []), (2, ["memory pressure is warning"]),
                                            (4, ["memory pressure is critical"])])
def test_preflight_says_memory_pressure(level, expected):
    fp = Fingerprint(loadgen="x", python="3", os="macOS 14.5", kernel=None, cpu=CpuFacts(model=None, logical_cores=10),
                     memory=MemoryFacts(total_mib=None, available_mib=None, swap_total_mib=None, swap_used_mib=None),
                     sample=EnvSample(at_s=0, mac=MacPower(), mac_memory=MacMemory(pressure_level=level)))
    assert [w.split(" (")[0] for w in preflight_warnings(fp)] == expected


def _pressure(fake, level: int, swap_used_mib: float, swapouts: int) -> None:
    """The fake Mac's sysctl and vm_stat from now on."""
    swap = f"vm.swapusage: total = 3072.00M  used = {swap_used_mib:.2f}M  free = {3072 - swap_used_mib:.2f}M  (encrypted)"
    (fake.state / "sysctl").write_text(SYSCTL.replace(SYSCTL.splitlines()[-1], swap)
                                      + f"kern.memorystatus_vm_pressure_level: {level}\n")
    (fake.state / "vm_stat").write_text(VM_STAT_M1.replace("4791178.", f"{swapouts}."))


def test_a_sweep_on_a_mac_records_memory_pressure_per_level_and_compare_flags_swapping(tmp_path, loadgen, mac):
    _pressure(mac, 1, 1024, 4791178)
    # Level 1 (c=1) serves completions 1-6, level 2 (c=2) 7-12: the Mac swaps 1 GiB during level 2.
    with StandIn(lambda n: _pressure(mac, 2, 2048, 4791178 + 65536) if n == 9 else None) as server:
        doc = _sweep(loadgen, server.origin, tmp_path / "cand", tmp_path / "empty")
    first, second = doc["targets"][0]["levels"]
    assert [(s["mac_memory"]["pressure_level"], s["swap_used_mib"]) for s in first["environment"]] == [(1, 1024)] * 2
    assert [(s["mac_memory"]["pressure_level"], s["swap_used_mib"]) for s in second["environment"]] == \
        [(1, 1024), (2, 2048)]
    assert second["environment"][0]["mac_memory"]["compressed_mib"] == 8341.7
    assert first["environment_changed"] == []
    assert [c.split(" at ")[0] for c in second["environment_changed"]] == ["memory pressure normal → warning",
                                                                          "swapping"]

    _pressure(mac, 1, 1024, 4791178)
    with StandIn() as server:
        _sweep(loadgen, server.origin, tmp_path / "base", tmp_path / "empty")
    code, out, err = loadgen("compare", tmp_path / "base", tmp_path / "cand")
    assert "candidate env-stand-in at level 2: memory pressure normal → warning" in err, err
    assert "candidate env-stand-in at level 2: swapping at " in err and "swap used 1024 → 2048 MiB, 1024 MiB swapped out" in err, err
    # the level is left out of the verdict, as a level that went to Low Power Mode is; the machine itself
    # (chip, cores, memory, power state) is the same on both sides, so compare does not refuse
    assert "left out: env-stand-in at level 2 of the candidate: the machine changed during it" in err, err
    assert code == 0, (out, err)


def test_env_on_a_mac_prints_the_memory_pressure(loadgen, mac):
    import json

    _pressure(mac, 2, 1024, 4791178)
    code, out, err = loadgen("env", "--interval", "0")
    assert code == 0, err
    assert "memory pressure: warning, 8341.7 MiB compressed" in out
    assert "warning: memory pressure is warning" in err
    code, out, err = loadgen("env", "--interval", "0", "--format", "json")
    assert code == 0, err
    assert json.loads(out)["mac"]["memory"]["pressure_level"] == 2
