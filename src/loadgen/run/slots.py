"""Saved and restored slots (`loadgen slots`): per cycle, a conversation's turn on slot s, the slot
saved to a file, forgotten, restored, and the conversation's next turn on s; the figures and the
verdict are analysis/slots.py's.

    turn 1    "[salt] User: M\nAssistant:"  on slot s (`id_slot`, `cache_prompt: true`)
    save      POST /slots/s?action=save {"filename"}
    forget    POST /slots/s?action=erase, or ("other") another conversation's turn on slot s
    restore   POST /slots/s?action=restore {"filename"}
    turn 2    turn 1's prompt, its answer, a new message (run/multiturn.py's chat text) on slot s
    control   POST /slots/s?action=erase, then the same turn 2 again: re-processed

Every turn goes down sweep's one path (run/engine.py `TurnSender`); the turns of the cycles are one
level (their records in requests.jsonl), the background load a second one: `concurrency` plain
requests, each a fresh conversation pinned to a slot the cycles do not use, for as long as the
cycles run, so save and restore are timed while other slots decode. The slot actions go through
client/slot_actions.py beside the load.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from dataclasses import dataclass
from pathlib import Path

from ..analysis.metric_defs import ttft_ms
from ..analysis.slots import CycleFigures, cycle_verdict
from ..client.backends import ConversationBackend, conversation_backend
from ..client.backends.conversation import turn_prompt
from ..client.slot_actions import SlotAction, SlotActionFailed, SlotClient
from ..client.tokenize import TokenizeUnavailable, server_tokenizer
from ..core.clock import now_ns
from ..core.errors import EXIT_FAILED, ConfigError, UserError
from ..core.records import LevelRun, RequestRecord
from .config import SweepConfig
from .engine import TurnSender
from .multiturn import CHARS_PER_TOKEN
from .prompts import synthetic_text
from .recording import stream_level
from .salts import new_decimal_salt
from .state import Run, RunObserver, TargetRun
from .target_setup import open_transport, prepare_targets, ready_probe

FORGET = ("erase", "other")  # how the server is made to forget the slot between save and restore


@dataclass(frozen=True, slots=True)
class SlotPlan:
    """What `loadgen slots` does: `cycles` cycles on each of `slots`, turn 1's message about
    `prompt_tokens` tokens, `concurrency` background requests on the other slots; `save_dir` the
    server's --slot-save-path when it is on this machine (file sizes read there)."""

    slots: tuple[int, ...]
    cycles: int
    prompt_tokens: int
    forget: str = "erase"
    concurrency: int = 0
    save_dir: Path | None = None


async def preflight(config: SweepConfig, plan: SlotPlan) -> None:
    """Before the first cycle: a slot the server does not have, or background load with no slot
    left for it, is the user's (ConfigError, exit 2); a server that refuses slot actions (no
    --slot-save-path) says so in its own words (UserError, exit 1), as does one that cannot be
    reached. Erasing the first slot asks."""
    target = config.targets[0]
    async with ready_probe(config, target) as probe:
        info = await probe.server_info()
    total = info.total_slots
    if total is not None:
        beyond = [s for s in plan.slots if s >= total]
        if beyond:
            raise ConfigError(f"--slot {beyond[0]}: the server has {total} slot(s), ids 0 to {total - 1}")
        if plan.concurrency and len(set(plan.slots)) >= total:
            raise ConfigError(f"--concurrency {plan.concurrency}: every one of the server's {total} slot(s) "
                              "runs cycles, none is left for the background load")
    async with SlotClient(target.url, config.auth_headers(), config.timeout_s, config.insecure) as client:
        try:
            await client.erase(plan.slots[0])
        except SlotActionFailed as exc:
            said = "refuses slot actions: " if exc.status is not None else ""
            raise UserError(f"{target.display} {said}{exc}", EXIT_FAILED) from None


def _message(tokens: int, seed: int) -> str:
    return synthetic_text(tokens * CHARS_PER_TOKEN, seed).strip()[:tokens * CHARS_PER_TOKEN]


async def fitted_message(config: SweepConfig, url: str, tokens: int) -> tuple[str, int | None]:
    """Turn 1's message, cut with the server's tokenizer so that its whole prompt ("[salt] User:
    M\nAssistant:", BOS included) is `tokens` long (every salt is the same number of tokens), and
    that prompt's count; without /tokenize an estimate at CHARS_PER_TOKEN and None. The longest cut
    that is not longer, found by bisection (a dozen /tokenize calls per target)."""
    text = synthetic_text(tokens * CHARS_PER_TOKEN * 2, 7919).strip()
    salt = new_decimal_salt()
    try:
        async with server_tokenizer(url, headers=config.auth_headers(), timeout_s=config.timeout_s,
                                    insecure=config.insecure) as tokenizer:
            async def count(n: int) -> int:
                return await tokenizer.count(turn_prompt(salt, [], text[:n]))

            lo, hi = 1, len(text)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if await count(mid) <= tokens else (lo, mid - 1)
            return text[:lo], await count(lo)
    except TokenizeUnavailable:
        return _message(tokens, 7919), None


def _record(level: LevelRun, seq: int) -> RequestRecord | None:
    return next((r for r in reversed(list(level.records)) if r.seq == seq), None)


@dataclass(slots=True)
class _Cycles:
    """One target's cycles: the sender of their turns, the slot client, the numbering."""

    plan: SlotPlan
    level: LevelRun
    sender: TurnSender
    client: SlotClient
    seqs: itertools.count
    message: str  # turn 1's, the same in every cycle: the salt keeps the cycles apart

    async def turn(self, slot: int, salt: str, history: list[tuple[str, str]], message: str
                   ) -> tuple[str | None, RequestRecord | None]:
        seq = next(self.seqs)
        answer = await self.sender.send(slot, seq, salt, history, message, slot)
        return answer, _record(self.level, seq)

    async def cycle(self, slot: int, index: int) -> CycleFigures:
        salt, message = new_decimal_salt(), self.message
        answer, first = await self.turn(slot, salt, [], message)
        if answer is None or first is None:
            return CycleFigures(slot, error=f"turn 1 failed: {_failure(first)}")
        filename = f"loadgen-{salt}-slot{slot}.bin"
        try:
            saved = await self.client.save(slot, filename)
            await self._forget(slot)
            restored = await self.client.restore(slot, filename)
        except SlotActionFailed as exc:
            return CycleFigures(slot, prompt_tokens=_prompt_tokens(first), error=f"slot action refused: {exc}")
        history = [(message, answer)]
        nxt = _message(32, 104729 * slot + index)
        _, second = await self.turn(slot, salt, history, nxt)
        with contextlib.suppress(SlotActionFailed):
            await self.client.erase(slot)
        _, control = await self.turn(slot, salt, history, nxt)
        return _figures(slot, first, saved, restored, second, control, self._file_bytes(filename))

    async def _forget(self, slot: int) -> None:
        if self.plan.forget == "erase":
            await self.client.erase(slot)
        else:  # another conversation on the slot replaces its cache
            await self.turn(slot, new_decimal_salt(), [], self.message)

    def _file_bytes(self, filename: str) -> int | None:
        if self.plan.save_dir is None:
            return None
        try:
            return (self.plan.save_dir / filename).stat().st_size
        except OSError:
            return None


def _prompt_tokens(r: RequestRecord) -> int | None:
    """The whole prompt the slot held: what it processed (prompt_n) and what it reused (cache_n)."""
    return None if r.prompt_n is None else r.prompt_n + (r.cache_n or 0)


def _failure(r: RequestRecord | None) -> str:
    return "no record" if r is None else f"{r.error_kind}: {r.error_message}"


def _figures(slot: int, first: RequestRecord, saved: SlotAction, restored: SlotAction, second: RequestRecord | None,
             control: RequestRecord | None, file_bytes: int | None) -> CycleFigures:
    error = None if second is not None and second.ok else f"turn 2 failed: {_failure(second)}"
    return CycleFigures(
        slot, prompt_tokens=_prompt_tokens(first), n_saved=saved.n_saved, n_written=saved.n_written, save_ms=saved.save_ms,
        n_restored=restored.n_restored, n_read=restored.n_read, restore_ms=restored.restore_ms,
        cache_n=second.cache_n if second is not None else None, ttft_ms=ttft_ms(second) if second else None,
        control_cache_n=control.cache_n if control is not None and control.ok else None,
        control_ttft_ms=ttft_ms(control) if control is not None and control.ok else None,
        file_bytes=file_bytes, error=error)


async def _background(sender: TurnSender, slots: list[int], plan: SlotPlan, message: str,
                      stop: asyncio.Event) -> None:
    """`plan.concurrency` workers sending fresh conversations, each pinned to one of `slots` in
    turn, until `stop`."""
    seqs = itertools.count()

    async def worker(w: int) -> None:
        while not stop.is_set():
            seq = next(seqs)
            await sender.send(w, seq, new_decimal_salt(), [], message, slots[seq % len(slots)])

    await asyncio.gather(*(worker(w) for w in range(plan.concurrency)))


async def run_slots(run: Run, obs: RunObserver, plan: SlotPlan) -> None:
    """Fill `run`: per reachable target, the plan's cycles (one level) beside its background load
    (a second level), each cycle's figures in the target's `slot_cycles`."""
    live = await prepare_targets(run, obs)
    for t in live:
        await _target_slots(run, obs, t, plan)


async def _target_slots(run: Run, obs: RunObserver, t: TargetRun, plan: SlotPlan) -> None:
    config = run.config
    backend: ConversationBackend = conversation_backend(config.api, config.generation, t.model)
    cycles = stream_level(LevelRun(target=t.label, concurrency=len(plan.slots)), run.sink, keep=True)
    background = stream_level(LevelRun(target=t.label, concurrency=plan.concurrency), run.sink, keep=True)
    t.levels += [cycles] + ([background] if plan.concurrency else [])
    total = t.info.total_slots if t.info and t.info.total_slots else max(plan.slots) + 1
    others = [s for s in range(total) if s not in plan.slots]
    message, counted = await fitted_message(config, t.target.probe_url, plan.prompt_tokens)
    obs.message(f"{t.label}: turn 1's prompt is " + (f"{counted:,} tokens by its tokenizer" if counted is not None
                                                       else f"about {plan.prompt_tokens:,} tokens (no /tokenize)"))
    transport = await open_transport(config, t, obs, len(plan.slots) + plan.concurrency)
    stop = asyncio.Event()
    try:
        async with SlotClient(t.target.url, config.auth_headers(), config.timeout_s, config.insecure) as client:
            run_cycles = _Cycles(plan, cycles, TurnSender(cycles, transport, backend, obs), client, itertools.count(),
                                 message)
            for level in t.levels:
                obs.level_started(level, None, None)
                level.start_ns = now_ns()
            load = asyncio.ensure_future(_background(TurnSender(background, transport, backend, obs), others,
                                                     plan, message, stop)) if plan.concurrency and others else None
            try:
                await _all_cycles(run_cycles, t, plan, obs)
            finally:
                stop.set()
                if load is not None:
                    await load
    finally:
        for level in t.levels:
            level.records_done()
            level.end_ns, level.finished = now_ns(), True
        t.read_clock = transport.read_clock
        await transport.close()
    for level in t.levels:
        obs.level_done(run, t, level)


async def _all_cycles(run_cycles: _Cycles, t: TargetRun, plan: SlotPlan, obs: RunObserver) -> None:
    """The cycles, each slot's one after another, the slots side by side."""

    async def on_slot(slot: int) -> None:
        for i in range(plan.cycles):
            figures = await run_cycles.cycle(slot, i)
            t.slot_cycles.append(figures)
            obs.message(f"{t.label}: slot {slot} cycle {i + 1}: " + _said(figures))

    await asyncio.gather(*(on_slot(s) for s in plan.slots))


def _said(c: CycleFigures) -> str:
    verdict, why = cycle_verdict(c)
    return f"{verdict} ({why})"
