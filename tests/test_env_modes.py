"""The environment record of `prefill`, `depth` and `soak` (docs/environment.md), as a sweep's: the
fingerprint before the first step, the machine sampled through each step (or the soak), on a built
sysfs tree that a simulated llama-server changes while it serves a chosen completion."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from loadgen.analysis.env_drift import changed_levels, environment_differences
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
    assert len(level["environment"]) >= 10  # 2 s at 0.05 s, thinned to at most 100
    assert [c.split(" at ")[0] for c in level["environment_changed"]] == ["PCI 0000:01:00.0: PCIe Gen4 x16 → Gen3 x16"]


def test_no_environment_records_none_in_a_step_run(tmp_path, loadgen):
    tree = build_tree(tmp_path / "m")
    with SimThread(slots=2) as sim:
        doc = run_steps(loadgen, "depth", sim.url, tree, tmp_path / "run", "--no-environment")
    assert "environment" not in doc
    assert all("environment" not in row for row in doc["targets"][0]["depth"]["rows"])
