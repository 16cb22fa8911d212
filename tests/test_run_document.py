"""The typed run document (core.rundoc.RunDocument): the golden runs read back as it with every
figure they hold, their kind as a RunKind and open loop as the one rule says."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from loadgen.core.rundoc import RunDocument, RunKind, is_open_loop
from loadgen.results.reader import load_run, load_run_dict

DATA = Path(__file__).parent / "data"
GOLDEN = sorted(p.name for p in DATA.iterdir() if (p / "run.json").is_file())


@pytest.mark.parametrize("name", GOLDEN)
def test_a_golden_run_reads_back_typed_with_every_figure_it_holds(name):
    raw, doc = load_run_dict(DATA / name), load_run(DATA / name)
    assert doc.kind is RunKind(raw["kind"]) and doc.kind.has_levels
    assert doc.open_loop == is_open_loop(raw)
    assert [t.label for t in doc.targets] == [t["label"] for t in raw["targets"]]
    for typed, target in zip(doc.targets, raw["targets"]):
        assert len(typed.levels) == len(target.get("levels", []))
        for lv, raw_lv in zip(typed.levels, target.get("levels", [])):
            held = msgspec.to_builtins(lv)
            assert {k: held[k] for k in raw_lv if k in held} == {k: v for k, v in raw_lv.items() if k in held}
        if target.get("verdict"):
            assert typed.verdict.verdict == target["verdict"]["verdict"]
            assert [v.queued for v in typed.verdict.levels] == [v["queued"] for v in target["verdict"]["levels"]]


@pytest.mark.parametrize("kind, has_levels", [("sweep", True), ("demo", True), ("prefill", False),
                                              ("depth", False), ("soak", False)])
def test_each_kind_is_a_run_kind_and_says_whether_it_has_levels(kind, has_levels):
    doc = RunDocument.of({"kind": kind, "targets": []})
    assert (doc.kind, doc.kind.has_levels) == (RunKind(kind), has_levels)


@pytest.mark.parametrize("config, open_loop", [(None, False), ({}, False), ({"mode": "concurrency"}, False),
                                               ({"mode": "rate"}, True)])
def test_open_loop_is_the_one_rule(config, open_loop):
    raw = {"targets": [], **({} if config is None else {"config": config})}
    assert RunDocument.of(raw).open_loop is open_loop is is_open_loop(raw)
