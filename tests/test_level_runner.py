"""One run path: every run kind sends its levels through the LevelRunner it is given (the one-process
runner here, counted), against the in-process simulator; no kind asks which runner it has."""

from __future__ import annotations

import pytest
import uvloop

from loadgen.client.backends import GenerationParams
from loadgen.core.records import LevelRun
from loadgen.core.rundoc import RunKind
from loadgen.run.config import SoakSettings, SweepConfig, Target
from loadgen.run.level_runner import LocalRunner, TargetLoad
from loadgen.run.prompts import PromptSource
from loadgen.run.soak import run_soak
from loadgen.run.state import Run
from loadgen.run.steps import run_steps
from loadgen.run.sweep import run_sweep
from loadgen.sim import load_profile, start_simulator

SMOKE = load_profile("smoke")


class Counting(LocalRunner):
    """The one-process runner, noting each call: ("ahead" or "run", the level's key)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int | float]] = []

    async def connect_ahead(self, load: TargetLoad, level: LevelRun, latency_s: float | None) -> None:
        self.calls.append(("ahead", level.level))
        await super().connect_ahead(load, level, latency_s)

    async def run(self, load: TargetLoad, level: LevelRun) -> str | None:
        self.calls.append(("run", level.level))
        return await super().run(load, level)


class Quiet:
    def __getattr__(self, name):  # every observer call (message, level_done, step_done, ...) is ignored
        return lambda *args, **kwargs: None


def _config(url: str, **kw) -> SweepConfig:
    kw.setdefault("concurrency", (1,))  # an open loop's is not read; a step's is one
    return SweepConfig(targets=(Target(url, "smoke"),), generation=GenerationParams(prompt="hi", n_predict=4, seed=1),
                       warmup=1, wait_ready_s=5, probe_interval_s=0, **kw)


def _run_kind(kind: str) -> tuple[Run, Counting]:
    runner = Counting()

    async def main() -> Run:
        async with await start_simulator(SMOKE, slots=4, seed=3) as sim:
            if kind == "sweep":
                run = Run(_config(sim.url, concurrency=(1, 2), requests_per_level=4))
                await run_sweep(run, Quiet(), runner)
            elif kind == "open-loop sweep":
                run = Run(_config(sim.url, rates=(20.0,), requests_per_level=4, max_in_flight=3))
                await run_sweep(run, Quiet(), runner)
            elif kind == "soak":
                run = Run(_config(sim.url, concurrency=(2,)), RunKind.SOAK)
                settings = SoakSettings(concurrency=2, duration_s=0.5, checkpoint_interval_s=60, prompt_tokens=None,
                                        probe_interval_s=0, prompt_source="synthetic")
                run.settings = settings
                await run_soak(run, Quiet(), PromptSource(), settings, runner)
            else:
                run = Run(_config(sim.url), RunKind.PREFILL)
                await run_steps(run, Quiet(), PromptSource(), (8, 32, 64), n_predict=1, repeat=2, salt_only_below=False,
                                runner=runner)
            return run
    return uvloop.run(main()), runner


# Expected calls, written before the runs: a sweep's and a soak's levels open their connections
# ahead, then run; a step is one request at a time on the warm-up's connection, so it only runs (and
# a prompt of 8 tokens cannot hold the salt: that step is skipped, no request sent).
@pytest.mark.parametrize("kind, calls, levels", [
    ("sweep", [("ahead", 1), ("run", 1), ("ahead", 2), ("run", 2)], 2),
    ("open-loop sweep", [("ahead", 20.0), ("run", 20.0)], 1),
    ("soak", [("ahead", 2), ("run", 2)], 1),
    ("prefill", [("run", 1), ("run", 1)], 2),
])
def test_every_run_kind_sends_its_levels_through_the_runner_it_is_given(kind, calls, levels):
    run, runner = _run_kind(kind)
    (t,) = run.targets
    assert t.error is None
    assert runner.calls == calls
    assert len(t.levels) == levels
    for level in t.levels:
        assert level.finished and level.stopped_reason is None and not level.remote
        # the one-process runner measured its client load (a lag sample needs the loop to idle a
        # sampling interval, which a one-request step need not do; the CPU share is always read)
        assert level.client_cpu_fraction is not None
        assert sum(r.ok for r in level.records) >= 1
    if kind == "prefill":
        assert [s.size for s in t.steps] == [8, 32, 64] and t.steps[0].skipped and t.steps[0].level is None
