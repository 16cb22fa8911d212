"""A soak's machine folded per window (analysis/soak_machine.py): which windows a change flags, each
window's energy, and a bounded number of samples in memory however long the soak runs."""

from __future__ import annotations

import pytest

from loadgen.analysis import soak_machine
from loadgen.analysis.env_drift import level_changes
from loadgen.analysis.soak_machine import WINDOW_MARKS, SoakMachine, per_window
from loadgen.core.environment import STORED_SAMPLES, CpuTimes, EnvSample, GpuFacts, PciLink, RaplZone

J_PER_SAMPLE = 2  # the RAPL counter advances 2 J between two samples


def sample(k: int, *, gen: int = 4, limit: float = 300.0, throttle: tuple[str, ...] = (), steal: int = 0) -> EnvSample:
    """The k-th sample, at k/10 s: a GPU link at `gen` x16, RAPL at 2 J × k, 1000 jiffies per sample."""
    return EnvSample(
        at_s=k / 10,
        links=(PciLink(address="0000:01:00.0", pci_class="0x030200", gen=gen, width=16, max_gen=4, max_width=16),),
        rapl=(RaplZone(zone="intel-rapl:0", name="package-0", energy_uj=J_PER_SAMPLE * k * 1_000_000,
                       max_energy_range_uj=262143328850),),
        gpus=(GpuFacts(index=0, name="G", power_limit_w=limit, throttle_reasons=throttle),),
        cpu_times=CpuTimes(total_jiffies=1000 * k, steal_jiffies=steal))


def fold(samples: list[EnvSample], window_s: float = 1.0) -> SoakMachine:
    machine = SoakMachine(window_s, lambda: 0.0)
    for s in samples:
        machine.append(s)
    return machine


# 5 s of samples every 0.1 s in 1 s windows (window w holds samples 10w … 10w+9); each case changes
# the machine from sample k on, and the windows it flags are written before running.
CASES = [
    ("nothing changes", lambda k: sample(k), []),
    ("link downshift at 2.3 s, stays", lambda k: sample(k, gen=3 if k >= 23 else 4), [2]),
    ("link down at 2.3 s, back at 4.1 s", lambda k: sample(k, gen=3 if 23 <= k < 41 else 4), [2, 4]),
    ("link down at the first sample of window 3", lambda k: sample(k, gen=3 if k >= 30 else 4), [3]),
    ("power limit lowered at 1.5 s", lambda k: sample(k, limit=250.0 if k >= 15 else 300.0), [1]),
    ("thermal throttle from 3.2 s", lambda k: sample(k, throttle=("sw_thermal",) if k >= 32 else ()), [3]),
    ("thermal throttle 3.2–3.4 s only", lambda k: sample(k, throttle=("sw_thermal",) if 32 <= k <= 34 else ()), [3]),
    # 10% of window 2's jiffies stolen (limit 2%); before and after, none
    ("steal during window 2", lambda k: sample(k, steal=100 * min(max(k - 19, 0), 10)), [2]),
]


@pytest.mark.parametrize(("name", "make", "flagged"), CASES, ids=[c[0] for c in CASES])
def test_exactly_the_window_a_change_happened_in_is_flagged(name, make, flagged):
    machine = fold([make(k) for k in range(50)])
    windows = machine.windows()
    assert [w.index for w in windows] == [0, 1, 2, 3, 4]
    assert [w.index for w in windows if w.changes] == flagged


def test_each_window_holds_the_energy_since_the_last_sample_before_it():
    """Window 0 spans samples 0–9 (9 steps), every later one 10 steps from the last sample before it:
    so the windows add up to the soak's energy, 2 J × 49."""
    windows = fold([sample(k) for k in range(50)]).windows()
    assert [w.energy_j for w in windows] == [{"cpu": 18.0}] + [{"cpu": 20.0}] * 4
    assert [w.seconds for w in windows] == pytest.approx([0.9, 1.0, 1.0, 1.0, 1.0])
    assert sum(w.energy_j["cpu"] for w in windows) == J_PER_SAMPLE * 49


def test_the_stored_samples_judge_the_soak_as_all_of_them_do():
    samples = [sample(k, gen=3 if 230 <= k < 410 else 4) for k in range(500)]
    machine = fold(samples)
    assert [c.split(" at ")[0] for c in level_changes(list(machine))] == [
        c.split(" at ")[0] for c in level_changes(samples)]
    assert list(machine)[0] is samples[0] and list(machine)[-1] is samples[-1]  # the energy's ends


def test_memory_stays_bounded_however_many_windows(monkeypatch):
    """20,000 samples in 2,000 windows, the link flapping every 0.5 s (marks in every window): never
    more samples held than the level's store plus one open window, and no window lost."""
    monkeypatch.setattr(soak_machine, "STORED_SAMPLES", 20)
    machine, peak = SoakMachine(1.0, lambda: 0.0), 0
    for k in range(20_000):
        machine.append(sample(k, gen=3 if (k // 5) % 2 else 4))
        peak = max(peak, machine.in_memory())
    windows = machine.windows()
    assert len(windows) == 2_000 and all(w.changes for w in windows[1:])
    assert peak <= 20 + WINDOW_MARKS + 2 < 20_000 // 100
    assert STORED_SAMPLES == 100  # the module's own default is left alone


def test_windows_past_the_soaks_last_fold_into_it():
    """The exit sample may fall past the last window (the soak ended on its boundary): its energy and
    changes join the last window's, as the requests past it do."""
    windows = fold([sample(k, gen=3 if k >= 31 else 4) for k in range(32)]).windows()
    assert [w.index for w in windows] == [0, 1, 2, 3]
    folded = per_window(windows, 3)
    assert [w.energy_j["cpu"] for w in folded if w] == [18.0, 20.0, 20.0 + 4.0]
    assert [bool(w.changes) for w in folded if w] == [False, False, True]
    assert per_window(windows, 5)[4] is None  # no sample fell in it
