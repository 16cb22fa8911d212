"""The drift guard's rule (analysis/env_drift.environment_differences) on a table of two machines whose
expected verdicts were written down first: what refuses, what is only a note."""

from __future__ import annotations

import msgspec
import pytest

from loadgen.analysis.env_drift import environment_differences, level_changes
from loadgen.client.machine_facts import MachineReader, Roots
from loadgen.core.environment import CpuTimes, EnvSample, GpuFacts
from machine_tree import build_tree


def doc(tmp_path, name: str, build: str = "b1", **tree) -> dict:
    fp = MachineReader(Roots(*build_tree(tmp_path / name, **tree))).fingerprint(server={"A": {"build_info": build}})
    return {"environment": fp.to_dict(), "targets": []}


# (baseline tree, candidate tree, words each difference must hold (in order), words of the notes)
CASES = [
    ("same", {}, {}, [], []),
    ("governor", {}, {"governor": "powersave"}, ["CPU governor: baseline performance; candidate powersave"], []),
    ("cores", {}, {"cores": 8}, ["logical cores: baseline 4; candidate 8"], []),
    ("rapl cap", {"rapl_uj": 0, "rapl_limit_w": 241}, {"rapl_uj": 0, "rapl_limit_w": 100},
     ["RAPL package-0 limits: baseline long_term 241 W; candidate long_term 100 W"], []),
    ("build only", {}, {"build": "b2"}, [], ["A: server build b1 in the baseline, b2 in the candidate"]),
    ("steal is no fact", {}, {"steal": 5000}, [], []),
]


@pytest.mark.parametrize("base,cand,differences,notes", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_environment_differences(tmp_path, base, cand, differences, notes):
    got, said = environment_differences([doc(tmp_path, "a", **base)], [doc(tmp_path, "b", **cand)])
    assert got == differences
    assert said == notes


def test_neither_side_recorded_says_nothing_and_one_side_is_a_note(tmp_path):
    assert environment_differences([{"targets": []}], [{"targets": []}]) == ([], [])
    got, notes = environment_differences([{"targets": []}], [doc(tmp_path, "b")])
    assert got == [] and len(notes) == 1 and "baseline has no recorded environment" in notes[0]


def gpu(**kw) -> GpuFacts:
    return GpuFacts(index=0, name="G", **kw)


# (first sample, later sample, expected changes) for one level
LEVEL = [
    ("steady", EnvSample(at_s=0, gpus=(gpu(power_limit_w=350.0),)), EnvSample(at_s=1, gpus=(gpu(power_limit_w=350.0),)), []),
    ("power cap", EnvSample(at_s=0, gpus=(gpu(power_limit_w=350.0),)), EnvSample(at_s=1, gpus=(gpu(power_limit_w=250.0),)),
     ["GPU 0 power limit 350.0 W → 250.0 W"]),
    ("thermal appears", EnvSample(at_s=0, gpus=(gpu(),)), EnvSample(at_s=1, gpus=(gpu(throttle_reasons=("sw_thermal",)),)),
     ["GPU 0 clock-event reasons appeared: sw_thermal"]),
    ("idle is not a throttle", EnvSample(at_s=0, gpus=(gpu(),)),
     EnvSample(at_s=1, gpus=(gpu(throttle_reasons=("applications_clocks",)),)), []),
    ("steal 3%", EnvSample(at_s=0, cpu_times=CpuTimes(total_jiffies=0, steal_jiffies=0)),
     EnvSample(at_s=1, cpu_times=CpuTimes(total_jiffies=1000, steal_jiffies=30)), ["steal 3.0% of CPU time (limit 2%)"]),
    ("steal 2%", EnvSample(at_s=0, cpu_times=CpuTimes(total_jiffies=0, steal_jiffies=0)),
     EnvSample(at_s=1, cpu_times=CpuTimes(total_jiffies=1000, steal_jiffies=20)), []),
    ("turbo off", EnvSample(at_s=0, turbo=True), EnvSample(at_s=1, turbo=False), ["turbo on → off"]),
]


@pytest.mark.parametrize("first,later,expected", [c[1:] for c in LEVEL], ids=[c[0] for c in LEVEL])
def test_level_changes(first, later, expected):
    assert level_changes([first, later]) == expected
    assert level_changes([msgspec.convert(msgspec.to_builtins(first), EnvSample)]) == []  # one sample: no change


def _with(d: dict, **facts) -> dict:
    return {**d, "environment": {**d["environment"], **facts}}


# (baseline OS, candidate OS, baseline kernel, candidate kernel, differences, notes): written before the run.
# A missing fact (None: the reader did not know it) is not a changed fact: it is a note, never a difference.
UNKNOWN_CASES = [
    ("same", "Debian 12", "Debian 12", "6.1", "6.1", [], []),
    ("different", "Debian 12", "Ubuntu 24.04", "6.1", "6.1", ["OS: baseline Debian 12; candidate Ubuntu 24.04"], []),
    ("unknown candidate", "Debian 12", None, "6.1", "6.1", [], ["not compared (unknown on a side): OS"]),
    ("unknown baseline", None, "Debian 12", "6.1", "6.1", [], ["not compared (unknown on a side): OS"]),
    ("unknown both", None, None, "6.1", "6.1", [], []),
    ("unknown OS, kernel changed", "Debian 12", None, "6.1", "6.8", ["kernel: baseline 6.1; candidate 6.8"],
     ["not compared (unknown on a side): OS"]),
]


@pytest.mark.parametrize("base_os,cand_os,base_kernel,cand_kernel,differences,notes",
                         [c[1:] for c in UNKNOWN_CASES], ids=[c[0] for c in UNKNOWN_CASES])
def test_an_unknown_fact_is_not_compared(tmp_path, base_os, cand_os, base_kernel, cand_kernel, differences, notes):
    base = _with(doc(tmp_path, "a"), os=base_os, kernel=base_kernel)
    cand = _with(doc(tmp_path, "b"), os=cand_os, kernel=cand_kernel)
    assert environment_differences([base], [cand]) == (differences, notes)
