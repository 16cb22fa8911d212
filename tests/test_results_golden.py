"""The committed golden runs read back identically, and the writer's figures rebuild them byte for byte.

tests/data/sweep-smollm2 is a schema-version-1 run of a real llama-server; sweep-sim-v2 (closed loop,
streamed) and rate-sim-v2 (open loop) are version-2 runs of the simulator; capacity-sim-v3 is a
`loadgen capacity` run of the simulator written at schema version 3 (kind "sweep", the search's
settings only in its command line), before run.json named the command.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from loadgen.analysis.aggregate import summarize_level
from loadgen.analysis.saturation import target_verdict
from loadgen.core.rundoc import LevelSummary, is_open_loop
from loadgen.results.reader import load_probe, load_records, load_run_dict

DATA = Path(__file__).parent / "data"
V2 = ["sweep-sim-v2", "rate-sim-v2"]
# Level fields added (with a default) after the goldens were written: a golden lacks them, reads
# them as the default, and the writer's figures are compared on the golden's own fields.
NEWER_LEVEL_FIELDS = {"achieved_rate", "connections_opened", "connect_ms", "prompt_n", "predicted_n",
                      "cache_n", "cache_hit_ratio", "ttft_cache_hit_ms", "ttft_cache_miss_ms", "prefill_saved_ms",
                      "input_tokens", "request_rate", "total_tok_s"}


def as_golden(written: dict, golden: dict) -> dict:
    """`written` restricted to the golden's fields, in its order; anything else must be a newer field."""
    assert set(written) - set(golden) <= NEWER_LEVEL_FIELDS
    return {k: written[k] for k in golden}


@pytest.mark.parametrize("name", V2)
def test_a_version_2_run_reads_back_byte_for_byte(name):
    path = DATA / name / "run.json"
    doc = load_run_dict(path.parent)
    assert json.dumps(doc, indent=2, allow_nan=False) + "\n" == path.read_text(encoding="utf-8")


def test_a_version_1_run_reads_as_before_with_its_level_keys_filled_in():
    raw = json.loads((DATA / "sweep-smollm2" / "run.json").read_text(encoding="utf-8"))
    doc = load_run_dict(DATA / "sweep-smollm2")
    assert doc["schema_version"] == 1 and not is_open_loop(doc)
    for raw_target, target in zip(raw["targets"], doc["targets"]):
        for raw_level, level in zip(raw_target["levels"], target["levels"]):
            assert level == {**raw_level, "level": raw_level["concurrency"], "rate": None}


@pytest.mark.parametrize("name", V2)
def test_every_level_round_trips_through_the_one_level_schema(name):
    for target in load_run_dict(DATA / name)["targets"]:
        for level in target["levels"]:
            read = msgspec.convert(level, LevelSummary).to_dict(client_load=True)
            assert all(read[k] is None for k in set(read) - set(level))  # a newer field: its default
            assert as_golden(read, level) == level


@pytest.mark.parametrize("name", V2)
def test_the_writers_figures_rebuild_every_level_and_verdict(name):
    doc = load_run_dict(DATA / name)
    records, samples = load_records(DATA / name), load_probe(DATA / name)
    open_loop = is_open_loop(doc)
    assert open_loop == (name == "rate-sim-v2")
    for target in doc["targets"]:
        mine = [r for r in records if r.target == target["label"]]
        for level in target["levels"]:
            rebuilt = msgspec.structs.replace(
                summarize_level(level["concurrency"], [r for r in mine if r.level == level["level"]],
                                level["stopped_reason"], level["server_metrics_delta"], rate=level["rate"]),
                loop_lag_p99_ms=level["loop_lag_p99_ms"], loop_lag_max_ms=level["loop_lag_max_ms"],
                client_cpu_fraction=level["client_cpu_fraction"],
                # written before the field existed: the file has none, so neither has its rebuild
                concurrency_reached=level.get("concurrency_reached"))
            assert json.dumps(as_golden(rebuilt.to_dict(client_load=True), level)) == json.dumps(level)
        config = doc["config"]
        verdict = target_verdict(target, mine, [s for s in samples if s.target == target["label"]],
                                 config["knee_gain"], config["knee_latency"], open_loop)
        if open_loop:  # each open-loop level is judged on its own since issue 46 (analysis/open_loop.py)
            judged = [level.pop("open_loop") for level in verdict["levels"]]
            assert [j["verdict"] for j in judged] == ["keeps_up", "keeps_up"]
            assert verdict["verdict"] == ["sim keeps up with every offered rate (up to 10 req/s): it served "
                                          "what was offered and no backlog grew."]
            verdict["verdict"] = target["verdict"]["verdict"]
        assert json.dumps(verdict) == json.dumps(target["verdict"])


def test_a_version_3_capacity_run_reads_and_its_answer_is_rebuilt_from_its_command_line(tmp_path):
    import shutil

    from loadgen.core.rundoc import RunKind
    from loadgen.output.capacity_answer import answer_line
    from loadgen.results.reader import load_run

    saved = json.loads((DATA / "capacity-sim-v3" / "capacity.json").read_text())["capacity"]["verdict"]
    doc = load_run(DATA / "capacity-sim-v3")
    assert doc.kind is RunKind.SWEEP and doc.config is not None and doc.config.capacity is None
    assert answer_line(DATA / "capacity-sim-v3", doc) == saved
    copy = tmp_path / "cap"
    shutil.copytree(DATA / "capacity-sim-v3", copy)
    (copy / "capacity.json").unlink()  # the answer again, from run.json's levels and the argv's settings
    assert answer_line(copy, load_run(copy)) == f"{saved} (rebuilt from run.json: capacity.json is missing or unreadable)"
    assert saved.startswith("serves 2 concurrent users within e2e≤28 ms")


def test_a_capacity_runs_verdict_lists_its_levels_by_value_not_in_probe_order(loadgen):
    # the search probed 1, 2, 4, 3: the sentences read 2, 3, 4
    code, out, err = loadgen("analyze", DATA / "capacity-sim-v3")
    assert code == 0, err
    (gains,) = [line for line in out.splitlines() if "batching gain vs c=1" in line]
    levels = [int(part.split()[0]) for part in gains.split(": ", 1)[1].split("c=")[1:]]
    assert levels == [2, 3, 4], gains
