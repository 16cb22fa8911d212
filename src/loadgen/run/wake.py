"""A server waking from sleep (`loadgen wake`): per cycle, requests to the awake server (warm), an
idle wait until /props says `is_sleeping` (llama-server's --sleep-idle-seconds), and as many
requests at once to the sleeping server (cold); the verdict is analysis/wake.py's.

    warm    `concurrency` requests at once, each a fresh salted prompt (the server is awake)
    idle    nothing sent; /props polled every POLL_S until it says is_sleeping, for up to --idle
    cold    `concurrency` requests at once: the first wakes the server, the others wait for it too
    after   /props asked once more: the server is awake again

Only /props is asked while the server idles: on build 11434 a /slots read wakes a sleeping server
(/props, /health and /metrics do not). Every request goes down sweep's one path
(run/engine.py `TurnSender`) and is recorded in one level (requests.jsonl). A server already asleep
when the run starts is woken by one request first (recorded, in no cycle).
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from dataclasses import dataclass

from ..analysis.metric_defs import ttft_ms, ttft_queue_ms
from ..client.backends import ConversationBackend, conversation_backend
from ..client.probe import Probe
from ..core.clock import now_ns
from ..core.errors import EXIT_FAILED, UserError
from ..core.records import LevelRun, RequestRecord
from ..core.rundoc import WakeCycle
from .config import SweepConfig
from .engine import TurnSender
from .prompts import synthetic_text
from .recording import stream_level
from .salts import new_decimal_salt
from .state import Run, RunObserver, TargetRun
from .target_setup import open_transport, prepare_targets, ready_probe

POLL_S = 0.2  # how often /props is asked while the server idles
MESSAGE_CHARS = 160  # each request's message: a sentence or two, so the prefill stays small


@dataclass(frozen=True, slots=True)
class WakePlan:
    """What `loadgen wake` does: `cycles` cycles of `concurrency` warm then cold requests, each
    cycle waiting up to `idle_s` for the server to sleep."""

    cycles: int
    concurrency: int = 1
    idle_s: float = 30.0


async def preflight(config: SweepConfig) -> None:
    """Before the first cycle: a server that cannot be reached, or that does not say whether it
    sleeps (no `is_sleeping` in /props: another server, or a llama-server older than sleep), is
    named in one line (UserError, exit 1)."""
    target = config.targets[0]
    async with ready_probe(config, target) as probe:
        if await probe.is_sleeping() is None:
            raise UserError(f"{target.display}: /props says nothing of sleep (no is_sleeping): wake needs a "
                            "llama-server that sleeps (--sleep-idle-seconds)", EXIT_FAILED)


async def run_wake(run: Run, obs: RunObserver, plan: WakePlan) -> None:
    """Fill `run`: per reachable target, the plan's cycles in one level, each cycle's figures in the
    target's `wake_cycles`."""
    for t in await prepare_targets(run, obs):
        await _target_wake(run, obs, t, plan)


@dataclass(slots=True)
class _Bursts:
    """One target's requests: the sender, the level that records them, the numbering."""

    sender: TurnSender
    level: LevelRun
    seqs: itertools.count
    concurrency: int

    async def burst(self) -> list[RequestRecord]:
        """`concurrency` requests sent at once, each a fresh conversation; their records."""
        seqs = [next(self.seqs) for _ in range(self.concurrency)]

        async def one(worker: int, seq: int) -> None:
            message = synthetic_text(MESSAGE_CHARS, 7919 + seq).strip()
            await self.sender.send(worker, seq, new_decimal_salt(), [], message)

        await asyncio.gather(*(one(w, s) for w, s in enumerate(seqs)))
        by_seq = {r.seq: r for r in self.level.records}
        return [by_seq[s] for s in seqs if s in by_seq]


async def _target_wake(run: Run, obs: RunObserver, t: TargetRun, plan: WakePlan) -> None:
    config = run.config
    backend: ConversationBackend = conversation_backend(config.api, config.generation, t.model)
    level = stream_level(LevelRun(target=t.label, concurrency=plan.concurrency), run.sink, keep=True)
    t.levels.append(level)
    transport = await open_transport(config, t, obs, plan.concurrency)
    bursts = _Bursts(TurnSender(level, transport, backend, obs), level, itertools.count(), plan.concurrency)
    try:
        async with Probe(t.target.url, config.auth_headers(), config.timeout_s, config.insecure) as probe:
            obs.level_started(level, None, None)
            level.start_ns = now_ns()
            if await probe.is_sleeping():
                obs.message(f"{t.label}: asleep at the start; one request wakes it first (in no cycle)")
                await bursts.burst()
            for i in range(plan.cycles):
                row = await _cycle(i + 1, bursts, probe, plan)
                t.wake_cycles.append(row)
                obs.message(f"{t.label}: cycle {i + 1}: {_said(row)}")
    finally:
        level.records_done()
        level.end_ns, level.finished = now_ns(), True
        t.read_clock = transport.read_clock
        await transport.close()
    obs.level_done(run, t, level)


async def _cycle(index: int, bursts: _Bursts, probe: Probe, plan: WakePlan) -> WakeCycle:
    warm = await bursts.burst()
    slept_after = await _wait_for_sleep(probe, plan.idle_s)
    cold = await bursts.burst() if slept_after is not None else []
    awake = (await probe.is_sleeping()) is False if cold else None
    failed = [r for r in warm + cold if not r.ok]
    return WakeCycle(
        cycle=index, slept=slept_after is not None, slept_after_s=slept_after,
        warm_ttft_ms=_median([ttft_ms(r) for r in warm if r.ok]), cold_ttft_ms=_median([ttft_ms(r) for r in cold if r.ok]),
        cold_first_ttft_ms=min((v for r in cold if r.ok and (v := ttft_ms(r)) is not None), default=None),
        warm_prompt_ms=_median([r.prompt_ms for r in warm if r.ok]), cold_prompt_ms=_median([r.prompt_ms for r in cold if r.ok]),
        warm_wait_ms=_median([ttft_queue_ms(r) for r in warm if r.ok]),
        cold_wait_ms=_median([ttft_queue_ms(r) for r in cold if r.ok]), awake_after=awake, requests_ok=sum(r.ok for r in warm + cold), failed=len(failed),
        error=f"{failed[0].error_kind}: {failed[0].error_message}" if failed else None)


async def _wait_for_sleep(probe: Probe, idle_s: float) -> float | None:
    """Seconds until /props said is_sleeping, polled every POLL_S; None when it did not within `idle_s`."""
    start = time.monotonic()
    while (elapsed := time.monotonic() - start) <= idle_s:
        if await probe.is_sleeping():
            return elapsed
        await asyncio.sleep(POLL_S)
    return None


def _median(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def _said(c: WakeCycle) -> str:
    if c.failed:
        return f"{c.failed} request(s) failed ({c.error})"
    if not c.slept:
        return "the server did not sleep"
    cold = f"{c.cold_ttft_ms:,.0f}" if c.cold_ttft_ms is not None else "?"
    warm = f"{c.warm_ttft_ms:,.0f}" if c.warm_ttft_ms is not None else "?"
    return f"slept after {c.slept_after_s:.1f} s; TTFT cold {cold} ms vs warm {warm} ms"
