"""The fast transport against the real llama-server: the same records as the aiohttp transport."""

from __future__ import annotations

import pytest
import uvloop

from loadgen.client.backends import GenerationParams
from loadgen.run.config import SweepConfig, Target
from loadgen.run.level_runner import LocalRunner
from loadgen.run.state import Run
from loadgen.run.sweep import run_sweep

pytestmark = pytest.mark.real


class Quiet:
    def message(self, text: str) -> None:
        pass

    def level_started(self, *args) -> None:
        pass

    def request_done(self, record) -> None:
        pass

    def level_done(self, run, target, level) -> None:
        pass


def _records(url: str, transport: str, api: str, stream: bool, monkeypatch) -> list[tuple]:
    salts = (f"00000000-0000-4000-8000-{n:012d}" for n in range(10_000))  # the same prompts for both
    monkeypatch.setattr("loadgen.run.engine.new_salt", lambda: next(salts))
    config = SweepConfig(targets=(Target(url, "real"),), concurrency=(1, 4), api=api,
                         generation=GenerationParams(prompt="Count to ten.", n_predict=12, seed=7, stream=stream),
                         requests_per_level=6, warmup=1, transport=transport)
    run = Run(config=config)
    uvloop.run(run_sweep(run, Quiet(), LocalRunner()))
    assert run.complete, [t.error for t in run.targets]
    return sorted((r.level, r.seq, r.salt, r.status, r.error_kind, r.output_tokens, r.predicted_n, r.prompt_n,
                   r.chunks, r.headers_ns is not None and r.send_ns <= r.headers_ns <= r.complete_ns)
                  for t in run.targets for lv in t.levels for r in lv.records)


@pytest.mark.parametrize("api", ["llamacpp", "completions", "chat"])
@pytest.mark.parametrize("stream", [False, True], ids=["non-stream", "stream"])
def test_records_match_across_transports(real_servers, monkeypatch, api, stream):
    four, _ = real_servers
    fast = _records(four.url, "fast", api, stream, monkeypatch)
    slow = _records(four.url, "aiohttp", api, stream, monkeypatch)
    assert len(fast) == 12 and all(r[3] == 200 and r[4] is None and r[5] == 12 and r[-1] for r in fast)
    if stream:
        assert all(r[8] and r[8] >= 1 for r in fast)
    # llama-server closes the connection after each streamed response although it announces
    # keep-alive; both transports send streams with Connection: close, so neither reuses such a
    # connection, and no request is lost to that race (nor retried behind the user's back).
    assert fast == slow
