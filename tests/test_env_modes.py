"""The environment record of `prefill`, `depth` and `soak` (docs/environment.md), as a sweep's: the
fingerprint before the first step, the machine sampled through each step (or the soak), on a built
sysfs tree that a simulated llama-server changes while it serves a chosen completion."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from loadgen.analysis import soak_machine
from loadgen.analysis.env_drift import changed_levels, environment_differences
from loadgen.analysis.soak_machine import WINDOW_MARKS, SoakMachine
from loadgen.results.reader import load_run_dict
from machine_tree import build_tree, set_energy, set_link
from servers import SimThread


def on_completion(sim: SimThread, act: Callable[[int], None]) -> None:
    """`act(n)` as the simulator's n-th completion (0-based, the warm-up's first) arrives."""
    server = sim.sim.server
    serve = server.completion

    async def completion(request: Any, api: Any) -> Any:
        act(server._n_requests)
        return await serve(request, api)

    server.completion = completion


STEPS = {"prefill": ("--prompt-tokens", "64,256", "prefill", "prompt_tokens"),
         "depth": ("--depths", "64,256", "depth", "depth")}


def run_steps(loadgen, kind: str, url: str, tree: tuple[Path, Path], out: Path, *extra: str) -> dict:
    flag, sizes, section, _ = STEPS[kind]
    code, _, err = loadgen(kind, "--url", url, flag, sizes, "--repeat", "3", "--warmup", "1",
                           "--sysfs", tree[0], "--procfs", tree[1], "--env-interval", "0.05",
                           "--idle-power", "0", "--output", out, *extra)
    assert code == 0, err
    return load_run_dict(out)


@pytest.mark.parametrize("kind", ["prefill", "depth"])
def test_a_step_run_records_the_machine_and_flags_the_step_it_changed_under(tmp_path, loadgen, kind):
    """Completion 0 is the warm-up, 1–3 the first step's, 4–6 the second's: the link drops at 5."""
    tree = build_tree(tmp_path / "m", gpu_link=(4, 16))
    with SimThread(slots=2) as sim:
        on_completion(sim, lambda n: set_link(tree[0], 3, 16) if n == 5 else None)
        doc = run_steps(loadgen, kind, sim.url, tree, tmp_path / "run")
    assert doc["environment"]["cpu"]["model"] == "Test CPU 9000"
    _, _, section, size_key = STEPS[kind]
    first, second = doc["targets"][0][section]["rows"]
    assert (first[size_key], second[size_key]) == (64, 256)
    assert len(first["environment"]) >= 2 and len(second["environment"]) >= 2  # start and end at least
    assert first["environment_changed"] == []
    assert [c.split(" at ")[0] for c in second["environment_changed"]] == [
        "PCI 0000:01:00.0: PCIe Gen4 x16 → Gen3 x16"]
    assert [c.split(": PCIe")[0] for c in changed_levels([doc])] == [
        f"{doc['targets'][0]['label']} at level 256: PCI 0000:01:00.0"]
    code, _, err = loadgen("analyze", tmp_path / "run")
    flagged = [line for line in err.splitlines() if "the machine changed during the level" in line]
    assert code == 0 and len(flagged) == 1 and "at level 256" in flagged[0] and "Gen3 x16" in flagged[0], err


def test_prefill_energy_per_step_is_exact_and_the_drift_guard_reads_steps(tmp_path, loadgen):
    """Each completion adds 2 J to the RAPL counter; a prefill request generates one token, so each
    step's gross and net J/token are 2 J exactly. A second run on a Gen3 tree differs under load."""
    tree = build_tree(tmp_path / "m", gpu_link=(4, 16), rapl_uj=1_000_000)
    energy = {"uj": 1_000_000}

    def spend(n: int) -> None:
        energy["uj"] += 2_000_000
        set_energy(tree[0], energy["uj"])
    with SimThread(slots=2) as sim:
        on_completion(sim, spend)
        doc = run_steps(loadgen, "prefill", sim.url, tree, tmp_path / "run", "--idle-power", "0.2")
    assert doc["environment"]["idle_power_w"] == {"cpu": 0.0}
    for row in doc["targets"][0]["prefill"]["rows"]:
        (cpu,) = row["energy"]
        assert cpu["energy_j"] == pytest.approx(6.0) and cpu["j_per_token"] == pytest.approx(2.0)
        assert cpu["net_j_per_token"] == pytest.approx(2.0)
    code, out, _ = loadgen("analyze", tmp_path / "run")
    assert code == 0 and "at level 256 (cpu): 2 J/token, net 2 J/token, 0.5 tokens/J" in out
    slow = build_tree(tmp_path / "slow", gpu_link=(3, 16))
    with SimThread(slots=2) as sim:
        other = run_steps(loadgen, "prefill", sim.url, slow, tmp_path / "other")
    differences, _ = environment_differences([doc], [other])
    assert any("baseline PCIe Gen4 x16; candidate levels 64, 256: PCIe Gen3 x16" in d for d in differences)


def test_a_soak_records_the_machine_through_its_level(tmp_path, loadgen):
    tree = build_tree(tmp_path / "m", gpu_link=(4, 16))
    with SimThread(slots=2) as sim:
        on_completion(sim, lambda n: set_link(tree[0], 3, 16) if n == 12 else None)
        code, _, err = loadgen("soak", "--url", sim.url, "--concurrency", "2", "--duration", "2s",
                               "--checkpoint-interval", "1s", "--n-predict", "8", "--sysfs", tree[0],
                               "--procfs", tree[1], "--env-interval", "0.05", "--output", tmp_path / "soak")
    assert code == 0, err
    doc = load_run_dict(tmp_path / "soak")
    assert doc["environment"]["kernel"] == "6.1.0-test"
    (level,) = doc["targets"][0]["levels"]
    assert len(level["environment"]) >= 3  # its first sample, each window's last, where the link changed
    assert [c.split(" at ")[0] for c in level["environment_changed"]] == ["PCI 0000:01:00.0: PCIe Gen4 x16 → Gen3 x16"]
    windows = doc["targets"][0]["soak"]["windows"]
    assert sum(bool(w["environment_changed"]) for w in windows) == 1  # the one the link dropped in


class Watched(SoakMachine):
    """The soak's machine, kept by the test: every one made, and the most samples each held."""

    made: list[Watched] = []

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.appended, self.peak = 0, 0
        Watched.made.append(self)

    def append(self, sample: Any) -> None:
        super().append(sample)
        self.appended += 1
        self.peak = max(self.peak, self.in_memory())


def soak(loadgen, url: str, tree: tuple[Path, Path], out: Path, duration: str, interval: str) -> dict:
    code, _, err = loadgen("soak", "--url", url, "--concurrency", "2", "--duration", duration,
                           "--checkpoint-interval", "1s", "--n-predict", "8", "--sysfs", tree[0],
                           "--procfs", tree[1], "--env-interval", interval, "--idle-power", "0", "--output", out)
    assert code == 0, err
    return load_run_dict(out)


def test_a_soak_flags_the_window_its_link_dropped_in_and_gives_each_window_its_energy(tmp_path, loadgen, monkeypatch):
    """3 windows of 1 s (a short 4th when the soak ends late). Every request adds 2 J to RAPL's
    counter; the link drops 0.5 s into window 1 (as the soak's own clock says), so a sample every
    0.02 s sees it there. Only window 1 is flagged (window 2 starts on Gen3 and stays), the drift,
    which compares it, says so, and the windows' joules add up to the soak's."""
    monkeypatch.setattr(Watched, "made", [])
    monkeypatch.setattr("loadgen.run.soak.SoakMachine", Watched)
    tree = build_tree(tmp_path / "m", gpu_link=(4, 16), rapl_uj=1_000_000)
    state = {"uj": 1_000_000, "dropped": False}

    def act(n: int) -> None:
        state["uj"] += 2_000_000
        set_energy(tree[0], state["uj"])
        machine = Watched.made[0] if Watched.made else None
        start = machine.start_s() if machine else None
        if machine and machine.open and start is not None and not state["dropped"] \
                and machine.open.last.at_s - start >= 0.5:
            set_link(tree[0], 3, 16)
            state["dropped"] = True
    with SimThread(slots=2) as sim:
        on_completion(sim, act)
        doc = soak(loadgen, sim.url, tree, tmp_path / "soak", "3s", "0.02")
    section = doc["targets"][0]["soak"]
    windows = section["windows"]
    assert len(windows) >= 3 and state["dropped"]
    assert [bool(w["environment_changed"]) for w in windows] == [True] + [False] * (len(windows) - 1)
    assert [c.split(" at ")[0] for c in windows[0]["environment_changed"]] == [
        "PCI 0000:01:00.0: PCIe Gen4 x16 → Gen3 x16"]
    (level,) = doc["targets"][0]["levels"]
    (soak_j,) = level["energy"]
    # A short last window may end before any sample fell in it: then it has no machine figures.
    sampled = [(w, w["energy"][0]) for w in windows if "energy" in w]
    assert [w["start_s"] for w, _ in sampled][:3] == [0.0, 1.0, 2.0]
    assert sum(e["energy_j"] for _, e in sampled) == pytest.approx(soak_j["energy_j"])
    assert soak_j["j_per_token"] == pytest.approx(2 / 8)  # 2 J a request of 8 tokens
    for w, e in sampled:
        assert e["energy_j"] / 2 == pytest.approx(round(e["energy_j"] / 2))  # whole requests' 2 J each
        tokens = w["output_tokens"]
        assert e["j_per_token"] == (pytest.approx(e["energy_j"] / tokens, abs=1e-6) if tokens else None)  # rounded to 6
    code, out, err = loadgen("analyze", tmp_path / "soak")
    assert code == 0 and "machine changed in window 1" in out, out  # the drift's cell
    warned = [line for line in err.splitlines() if "soak window 1 " in line]
    assert len(warned) == 1 and "the drift compares this window" in warned[0], err


def test_a_long_soak_holds_a_bounded_number_of_samples(tmp_path, loadgen, monkeypatch):
    """10 windows sampled every 0.01 s: far more samples read than the level may store, while the
    soak's machine never holds more than its store (20 here) and one open window's."""
    monkeypatch.setattr(Watched, "made", [])
    monkeypatch.setattr("loadgen.run.soak.SoakMachine", Watched)
    monkeypatch.setattr(soak_machine, "STORED_SAMPLES", 20)
    tree = build_tree(tmp_path / "m", gpu_link=(4, 16))
    with SimThread(slots=2) as sim:
        doc = soak(loadgen, sim.url, tree, tmp_path / "soak", "10s", "0.01")
    (machine,) = Watched.made
    assert machine.appended > 3 * (20 + WINDOW_MARKS + 2)
    assert machine.peak <= 20 + WINDOW_MARKS + 2
    windows = doc["targets"][0]["soak"]["windows"]
    assert len(windows) >= 10 and all(w["environment_changed"] == [] for w in windows)
    assert len(doc["targets"][0]["levels"][0]["environment"]) <= 20 + 1


def test_no_environment_records_none_in_a_step_run(tmp_path, loadgen):
    tree = build_tree(tmp_path / "m")
    with SimThread(slots=2) as sim:
        doc = run_steps(loadgen, "depth", sim.url, tree, tmp_path / "run", "--no-environment")
    assert "environment" not in doc
    assert all("environment" not in row for row in doc["targets"][0]["depth"]["rows"])
