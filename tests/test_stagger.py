"""Closed-loop workers start together by default, or spread over --stagger seconds (issue 16, item 13)."""

from __future__ import annotations

import json

import pytest
import uvloop

from loadgen.client.backends import GenerationParams, make_backend
from loadgen.client.fast import FastTransport
from loadgen.core.records import LevelRun, RequestRecord
from loadgen.run.engine import run_level
from servers import SimThread


def first_sends_s(records: list[RequestRecord]) -> list[float]:
    """Each worker's first send, in seconds after the earliest one, by worker index."""
    firsts: dict[int, int] = {}
    for r in records:
        firsts[r.worker] = min(firsts.get(r.worker, r.send_ns), r.send_ns)
    t0 = min(firsts.values())
    return [(firsts[w] - t0) / 1e9 for w in sorted(firsts)]


def sweep_records(loadgen, tmp_path, *extra: str) -> tuple[dict, list[RequestRecord]]:
    out = tmp_path / ("run" + "".join(extra).replace(".", "_"))
    with SimThread(slots=4) as sim:
        code, _, err = loadgen("sweep", "--url", sim.url, "--concurrency", "4", "--requests", "8", "--n-predict", "8",
                               "--warmup", "0", *extra, "--output", out)
    assert code == 0, err
    doc = json.loads((out / "run.json").read_text())
    records = [RequestRecord.from_dict(json.loads(line)) for line in (out / "requests.jsonl").read_text().splitlines()]
    return doc, records


def test_stagger_spreads_the_first_sends_evenly():
    """Worker i sends first at i × 0.6 / 4 s after the level starts: never earlier (a sleep never
    wakes early), and not much later. Measured from the level's own start: worker 0's first send can
    itself be late on a loaded machine, so gaps between first sends prove nothing either way."""
    async def main(url: str) -> LevelRun:
        transport = FastTransport()
        await transport.open(url, 4, 30)
        level = LevelRun(target="sim", concurrency=4)
        try:
            await run_level(level, transport, make_backend("llamacpp", GenerationParams(prompt="p", n_predict=8), None),
                            requests=8, duration_s=None, stagger_s=0.6)
        finally:
            await transport.close()
        return level

    with SimThread(slots=4) as sim:
        level = uvloop.run(main(sim.url))
    firsts = [min(r.send_ns for r in level.records if r.worker == w) - level.start_ns for w in range(4)]
    for i, t in enumerate(firsts):
        assert t >= i * 0.15e9 - 2e6, firsts  # uvloop's timers count whole ms from a cached loop time
    assert firsts[3] < (0.45 + 0.4) * 1e9, firsts  # not much later either (a loaded machine gets 0.4 s slack)


def test_stagger_is_recorded_and_keeps_the_budget(loadgen, tmp_path):
    doc, records = sweep_records(loadgen, tmp_path, "--stagger", "0.6")
    assert doc["config"]["stagger_s"] == 0.6
    firsts = first_sends_s(records)
    assert len(firsts) == 4 and firsts == sorted(firsts), firsts
    assert sorted({r.seq for r in records}) == list(range(8))  # the budget is kept
    assert {r.seq for r in records if r.send_ns == min(x.send_ns for x in records if x.worker == r.worker)} \
        == {0, 1, 2, 3}  # each worker's first request is its own


def test_by_default_the_workers_start_together(loadgen, tmp_path):
    doc, records = sweep_records(loadgen, tmp_path)
    assert doc["config"]["stagger_s"] == 0
    assert max(first_sends_s(records)) < 0.1


@pytest.mark.parametrize("args, message", [
    (("--rate", "2", "--stagger", "1"), "closed loop"),
    (("--concurrency", "2", "--duration", "2", "--stagger", "2"), "never start"),
    (("--concurrency", "2", "--stagger", "-1"), "--stagger"),
])
def test_a_stagger_that_cannot_apply_is_refused(loadgen, tmp_path, args, message):
    code, _, err = loadgen("sweep", "--ports", "9", *args, "--output", tmp_path / "run")
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_stagger_is_a_scenario_key(loadgen, tmp_path):
    scenario = tmp_path / "s.toml"
    scenario.write_text('mode = "sweep"\nports = [9]\nconcurrency = [4]\nstagger = 0.5\n')
    code, out, err = loadgen("run", scenario, "--check")
    assert code == 0 and "all valid" in out, err
    scenario.write_text('mode = "sweep"\nports = [9]\nrate = [4.0]\nstagger = 0.5\n')
    code, _, err = loadgen("run", scenario, "--check")
    assert code == 2 and "closed loop" in err
