"""Multi-turn conversations: `users` users, each holding a conversation of `turns` turns.

Each turn re-sends the whole history as a chat client does: every earlier message and the
server's own answer to it (the streamed text, exactly as it came), then a new message, with
`cache_prompt: true` (the mode's switch): to llama-server's /completion as raw text, or to
/v1/chat/completions as messages (`--api chat`; client/backends/conversation.py). Each turn goes
down sweep's one path (run/engine.py `TurnSender`): the API's backend builds its body and reads its
stream, the target's transport sends it (`--transport`, `--insecure`, its URL joined as sweep's,
kernel receive stamps where the transport takes them), and its record is a sweep request's. So the reuse measured is
what a chat client causes; the server re-evaluates what its tokenizer splits differently when its
own answer comes back as text (and always the last prompt token).

    turn k's prompt = "[<salt>] " + Σ_{j<k} ("User: " + m_j + "\nAssistant:" + a_j + "\n")
                      + "User: " + m_k + "\nAssistant:"                              (/completion)

The salt (one per user) comes first, so users never share a prefix with each other. Messages are
synthetic prose of about `message_tokens` tokens, seeded per user and turn. Between a user's
answer and their next message: `think_s` plus a seeded uniform draw in [0, think_jitter_s).

A conversation stops at its first failed turn (its history cannot go on). Records: one level
(its concurrency: the users) per target; `worker` is the user, `seq` = turn × users + user, so a
record's turn (0-based) is seq // users (analysis/cache.py `turn_of`).

Not a request source (run/request_source.py): a turn's body carries the server's answers to the
turns before it, so the bodies are made at send time, not built for the target before its levels.
"""

from __future__ import annotations

import asyncio
import random
import time

from ..client.backends import ConversationBackend, conversation_backend
from ..client.backends.conversation import History
from ..core.cache_mode import MultiTurn
from ..core.clock import now_ns
from ..core.records import LevelRun
from .engine import TurnSender
from .machine_sampling import level_sampling, machine_watch
from .prompts import synthetic_text
from .recording import stream_level
from .salts import new_decimal_salt
from .state import Run, RunObserver
from .target_setup import open_transport, prepare_targets, refuse_non_llm

CHARS_PER_TOKEN = 4  # English prose on common tokenizers: a message's length is asked in tokens


async def _user(mode: MultiTurn, user: int, sender: TurnSender, slots: int | None) -> None:
    """One conversation: each turn re-sends the history (the answers as they came), until a turn fails."""
    rng = random.Random(mode.seed * 1_000_003 + user)
    salt = new_decimal_salt()
    history: History = []
    for turn in range(mode.turns):
        message = synthetic_text(mode.message_tokens * CHARS_PER_TOKEN, 7919 * user + turn).strip()
        message = message[:mode.message_tokens * CHARS_PER_TOKEN]
        answer = await sender.send(user, turn * mode.users + user, salt, history, message,
                                   user % slots if mode.pin_slots and slots else None)
        if answer is None:
            return
        history.append((message, answer))
        if turn + 1 < mode.turns:
            await asyncio.sleep(mode.think_s + (rng.uniform(0, mode.think_jitter_s) if mode.think_jitter_s else 0))


async def run_multiturn(run: Run, obs: RunObserver, mode: MultiTurn) -> None:
    """Fill `run`: per reachable target, one level of `mode.users` conversations at once."""
    config = run.config
    live = await prepare_targets(run, obs)
    watch = await machine_watch(run, live, obs)  # the fingerprint, and each conversation level's machine samples
    for t in live:
        backend: ConversationBackend = conversation_backend(config.api, config.generation, t.model)
        level = stream_level(LevelRun(target=t.label, concurrency=mode.users), run.sink, keep=True,
                             time_scale=config.time_scale, origin_ns=run.start_ns)
        t.levels.append(level)
        slots = t.info.total_slots if t.info else None
        started = time.monotonic()
        transport = await open_transport(config, t, obs, mode.users)  # sweep's: --transport, --insecure, the URL
        try:
            obs.level_started(level, mode.users * mode.turns, None)
            sender = TurnSender(level, transport, backend, obs)
            async with level_sampling(watch, level):
                level.start_ns = now_ns()
                try:
                    await asyncio.gather(*(_user(mode, u, sender, slots) for u in range(mode.users)))
                except BaseException:
                    level.stopped_reason = level.stopped_reason or "interrupted"
                    raise
                finally:
                    level.records_done()
                    level.end_ns, level.finished = now_ns(), True
        finally:
            t.read_clock = transport.read_clock
            await transport.close()
        if refuse_non_llm(t, level, backend):  # sweep's one rule (analysis/evidence.py)
            continue
        obs.message(f"{t.label}: {mode.users} users × {mode.turns} turns in {time.monotonic() - started:.1f} s")
        obs.level_done(run, t, level)
