"""Multi-turn conversations: `users` users, each holding a conversation of `turns` turns.

Each turn re-sends the whole history as a chat client does: every earlier message and the
server's own answer to it (the streamed text, exactly as it came), then a new message, with
`cache_prompt: true` (the mode's switch): to llama-server's /completion as raw text, or to
/v1/chat/completions as messages (run/conversation_apis.py, `--api chat`). So the reuse measured is
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
"""

from __future__ import annotations

import asyncio
import random
import time

import aiohttp
import msgspec

from ..analysis.evidence import not_an_llm_server
from ..client.transport import tls_context
from ..core.baseurl import BaseUrl
from ..core.cache_mode import MultiTurn
from ..core.clock import now_ns
from ..core.records import CONNECT_ERROR, INVALID_JSON, NOT_JSON_MESSAGE, LevelRun, RequestRecord
from .conversation_apis import TURN_APIS, TurnApi
from .machine_sampling import level_sampling, machine_watch
from .prompts import synthetic_text
from .recording import stream_level
from .salts import new_decimal_salt
from .state import Run, RunObserver, TargetRun
from .target_setup import prepare_targets

CHARS_PER_TOKEN = 4  # English prose on common tokenizers: a message's length is asked in tokens


async def _turn(session: aiohttp.ClientSession, url: str, body: dict, api: TurnApi, record: dict) -> str | None:
    """One streamed turn to `url` (the endpoint's absolute URL): fills `record` (times, timings, slot);
    the answer text, or None on failure (record's error set)."""
    text: list[str] = []
    events, head = 0, b""
    record["send_ns"] = now_ns()
    try:
        async with session.post(url, json=body) as resp:
            record["status"] = resp.status
            if resp.status != 200:
                record["error_kind"] = f"http_{resp.status}"
                record["error_message"] = (await resp.text())[:200]
                return None
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    head = head if len(head) >= 200 else (head + line)[:200]
                    continue
                events += 1
                piece = api.read(line[5:], record)
                if piece:
                    stamp = now_ns()
                    record.setdefault("first_token_ns", stamp)
                    record["last_token_ns"] = stamp
                    text.append(piece)
    except (TimeoutError, aiohttp.ClientError, OSError, msgspec.DecodeError) as exc:
        record["error_kind"] = CONNECT_ERROR if "status" not in record else "disconnected"
        record["error_message"] = str(exc)[:200] or type(exc).__name__
        return None
    finally:
        record["complete_ns"] = now_ns()
    if not events:  # a 200 without one event (an HTML page): what analysis/evidence.py calls no completion
        record["error_kind"] = INVALID_JSON
        record["error_message"] = f"{NOT_JSON_MESSAGE}: {head.decode('utf-8', errors='replace')}"
        return None
    return "".join(text)


async def _user(run: Run, t: TargetRun, level: LevelRun, mode: MultiTurn, user: int,
                session: aiohttp.ClientSession, slots: int | None) -> None:
    g, api = run.config.generation, TURN_APIS[run.config.api]
    rng = random.Random(mode.seed * 1_000_003 + user)
    salt = new_decimal_salt()
    history: list[tuple[str, str]] = []
    for turn in range(mode.turns):
        message = synthetic_text(mode.message_tokens * CHARS_PER_TOKEN, 7919 * user + turn).strip()
        message = message[:mode.message_tokens * CHARS_PER_TOKEN]
        fields = {"max_tokens": g.n_predict, "temperature": g.temperature, "ignore_eos": g.ignore_eos,
                  "cache_prompt": mode.cache_prompt, "stream": True,
                  **({"model": run.config.model} if run.config.model is not None else {}),
                  **({"seed": g.seed} if g.seed is not None else {}),
                  **({"id_slot": user % slots} if mode.pin_slots and slots else {})}
        record: dict = {}
        # core.baseurl's rule, as sweep's transports join it: a base URL ending in /v1 is the OpenAI one
        url = BaseUrl.parse(t.target.url).url(api.path)
        answer = await _turn(session, url, api.body(salt, history, message, fields), api, record)
        level.records.append(RequestRecord(target=t.label, level=mode.users, worker=user,
                                           seq=turn * mode.users + user, salt=salt,
                                           intended_ns=record["send_ns"], **record))
        if answer is None:
            return
        history.append((message, answer))
        if turn + 1 < mode.turns:
            await asyncio.sleep(mode.think_s + (rng.uniform(0, mode.think_jitter_s) if mode.think_jitter_s else 0))


async def run_multiturn(run: Run, obs: RunObserver, mode: MultiTurn) -> None:
    """Fill `run`: per reachable target, one level of `mode.users` conversations at once."""
    config = run.config
    live = await prepare_targets(run, obs)
    watch = await machine_watch(run, live)  # the fingerprint, and each conversation level's machine samples
    for t in live:
        level = stream_level(LevelRun(target=t.label, concurrency=mode.users), run.sink, keep=True,
                             time_scale=config.time_scale, origin_ns=run.start_ns)
        t.levels.append(level)
        obs.level_started(level, mode.users * mode.turns, None)
        slots = t.info.total_slots if t.info else None
        timeout = aiohttp.ClientTimeout(total=config.timeout_s)
        started = time.monotonic()
        # llama-server closes a connection after a streamed answer (client/probe.py: closes_streams); a
        # kept-alive one would fail the next turn's write, so each turn opens its own.
        connector = aiohttp.TCPConnector(force_close=True, ssl=tls_context(config.insecure)
                                         if t.target.url.startswith("https:") else True)
        async with aiohttp.ClientSession(timeout=timeout, headers=config.auth_headers(), connector=connector) as session, \
                level_sampling(watch, level):
            level.start_ns = now_ns()
            try:
                await asyncio.gather(*(_user(run, t, level, mode, u, session, slots) for u in range(mode.users)))
            except BaseException:
                level.stopped_reason = level.stopped_reason or "interrupted"
                raise
            finally:
                level.records_done()
                level.end_ns, level.finished = now_ns(), True
        answer = not_an_llm_server(level.records, f"POST {TURN_APIS[config.api].path}")  # sweep's one rule
        if answer is not None:
            t.error = f"{t.target.display}: {answer}"
            continue
        obs.message(f"{t.label}: {mode.users} users × {mode.turns} turns in {time.monotonic() - started:.1f} s")
        obs.level_done(run, t, level)
