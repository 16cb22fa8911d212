"""`loadgen chat` records the machine as a sweep does (its fingerprint and each level's samples, the
same options), and `compare` tells a run without a record by what its config says."""

from __future__ import annotations

import json

from loadgen.analysis.env_drift import environment_differences
from machine_tree import build_tree


def chat(loadgen, url: str, tree, out, *extra: str) -> dict:
    code, _, err = loadgen("chat", "--url", url, "--users", "2", "--turns", "2", "--message-tokens", "8",
                           "--n-predict", "4", "--sysfs", tree[0], "--procfs", tree[1], "--env-interval", "0.05",
                           "--idle-power", "0.1", "--output", out, "--format", "json", *extra)
    assert code == 0, err
    return json.loads((out / "run.json").read_text())


def test_a_chat_run_records_the_machine_and_energy(tmp_path, loadgen, simulator):
    tree = build_tree(tmp_path / "m", gpu_link=(4, 16), rapl_uj=1_000_000)
    doc = chat(loadgen, simulator, tree, tmp_path / "chat")
    assert doc["environment"]["cpu"]["model"] == "Test CPU 9000"
    (level,) = doc["targets"][0]["levels"]
    assert len(level["environment"]) >= 2 and level["environment_changed"] == []
    assert [e["source"] for e in level["energy"]] == ["cpu"]
    off = chat(loadgen, simulator, tree, tmp_path / "off", "--no-environment")
    assert "environment" not in off and off["config"]["environment"] is False
    code, out, err = loadgen("compare", tmp_path / "off", tmp_path / "chat")
    assert code == 0 and "recorded with --no-environment" in err and "from before" not in err


# (config of a run without a record, the words its note has): written before running.
NOTES = [({"cache": {"kind": "multi_turn"}}, "a loadgen chat run from before chat recorded it"),
         ({"environment": False}, "recorded with --no-environment"),
         ({}, "a run from before loadgen recorded it")]


def test_the_note_on_a_run_without_a_record_follows_its_config():
    recorded = {"targets": [], "environment": {"loadgen": "x", "python": "3", "os": None, "kernel": None,
                                               "cpu": {"model": None, "logical_cores": 1},
                                               "memory": {"total_mib": None, "available_mib": None,
                                                          "swap_total_mib": None, "swap_used_mib": None},
                                               "sample": {"at_s": 0.0}}}
    for config, words in NOTES:
        _, notes = environment_differences([{"targets": [], "config": config}], [recorded])
        assert len(notes) == 1 and words in notes[0], (config, notes)
