"""The closed-loop engine: C workers send requests back to back until a level's budget is used.

It knows no server API (a `Backend` builds and reads bodies) and no HTTP library (a `Transport`
moves bytes). Everything it records is appended to a `LevelRun` the caller owns, so a run that is
cancelled (Ctrl-C) or whose server dies still has every record up to that moment.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Protocol

from . import records
from .backends import Backend
from .clock import now_ns
from .records import LevelRun, RequestRecord, ServerOutcome, make_record
from .transport import Transport, TransportError

# A target is given up when this many requests in a row could not even connect.
CONNECT_FAILURES_BEFORE_DOWN = 3


def new_salt() -> str:
    """A random (version 4, RFC 4122 variant) UUID in its usual text form.

    Equivalent to str(uuid.uuid4()) at a third of its cost, which shows at thousands of requests/s.
    """
    x = os.urandom(16).hex()
    return f"{x[:8]}-{x[8:12]}-4{x[13:16]}-{'89ab'[int(x[16], 16) & 3]}{x[17:20]}-{x[20:]}"


def new_decimal_salt() -> str:
    """A random version 4 UUID whose hex digits are all 0-9 (about 100 random bits).

    Tokenizers split runs of decimal digits by fixed rules (one token per digit, or per group of
    up to three), so every such salt is the same number of tokens, where a hex UUID's letters merge
    unpredictably (31 to 39 tokens on SmolLM2). Exact prompt lengths (`--prompt-tokens`) need that.
    """
    d = "".join(str(b % 10) for b in os.urandom(32))  # 256 % 10 != 0: a bias too small to matter here
    return f"{d[:8]}-{d[8:12]}-4{d[13:16]}-{'89'[d[16] in '01234']}{d[17:20]}-{d[20:32]}"


class Observer(Protocol):
    def level_started(self, target: str, concurrency: int, requests: int | None,
                      duration_s: float | None) -> None: ...

    def request_done(self, record: RequestRecord) -> None: ...


class NullObserver:
    def level_started(self, target: str, concurrency: int, requests: int | None,
                      duration_s: float | None) -> None:
        pass

    def request_done(self, record: RequestRecord) -> None:
        pass


async def run_level(
    level: LevelRun,
    transport: Transport,
    backend: Backend,
    *,
    requests: int | None,
    duration_s: float | None,
    observer: Observer | None = None,
    salt: Callable[[], str] = new_salt,
    give_up_after: int | None = CONNECT_FAILURES_BEFORE_DOWN,
    pause_after_error_s: float = 0.0,
) -> LevelRun:
    """Run `level.concurrency` workers until `requests` are sent or `duration_s` has passed.

    In-flight requests at the deadline are allowed to finish and are recorded. On cancellation each
    worker records its in-flight request as `cancelled` before the cancellation propagates.

    `salt` makes each request's salt (`new_decimal_salt` for exact prompt lengths). The level stops
    with "target down" after `give_up_after` connect failures in a row; None never gives up (a
    soak rides out a restart). A worker whose request failed waits `pause_after_error_s` before its
    next one, so a server that is down is not hammered with thousands of refused connections.
    """
    if requests is None and duration_s is None:
        raise ValueError("a level needs a request count or a duration")
    obs = observer or NullObserver()
    obs.level_started(level.target, level.concurrency, requests, duration_s)
    issued = 0
    connect_failures = 0
    level.start_ns = now_ns()
    deadline = level.start_ns + int(duration_s * 1e9) if duration_s is not None else None
    append = level.records.append
    method, path, build, parse = backend.method, backend.path, backend.build, backend.parse
    send_request = transport.request

    async def worker(index: int) -> None:
        nonlocal issued, connect_failures
        while level.stopped_reason is None:
            if requests is not None and issued >= requests:
                return
            if deadline is not None and now_ns() >= deadline:
                return
            seq = issued
            issued += 1
            request_salt = salt()
            body = build(request_salt)
            send_ns = now_ns()
            status = headers_ns = None
            try:
                response = await send_request(method, path, body)
            except TransportError as exc:
                complete_ns = now_ns()
                outcome = ServerOutcome(error_kind=exc.kind, error_message=exc.message)
            except asyncio.CancelledError:
                append(make_record(target=level.target, level=level.concurrency, worker=index,
                                   seq=seq, salt=request_salt, send_ns=send_ns, complete_ns=now_ns(),
                                   status=None, outcome=ServerOutcome(
                                       error_kind=records.CANCELLED,
                                       error_message="in flight when the run was stopped"),
                                   prompt_tokens_target=level.prompt_tokens))
                raise
            else:
                status, headers_ns, complete_ns = response.status, response.headers_ns, response.complete_ns
                outcome = parse(response.status, response.body)
            record = make_record(target=level.target, level=level.concurrency, worker=index, seq=seq,
                                 salt=request_salt, send_ns=send_ns, complete_ns=complete_ns, status=status,
                                 outcome=outcome, headers_ns=headers_ns, prompt_tokens_target=level.prompt_tokens)
            append(record)
            obs.request_done(record)
            if outcome.error_kind == records.CONNECT_ERROR:
                connect_failures += 1
                if (give_up_after is not None and connect_failures >= give_up_after
                        and level.stopped_reason is None):
                    level.stopped_reason = f"target down: {outcome.error_message}"
            else:
                connect_failures = 0
            if outcome.error_kind is not None and pause_after_error_s > 0:
                pause = pause_after_error_s if deadline is None else min(pause_after_error_s,
                                                                         max(0, deadline - now_ns()) / 1e9)
                await asyncio.sleep(pause)

    tasks = [asyncio.ensure_future(worker(i)) for i in range(level.concurrency)]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if level.stopped_reason is None:
            level.stopped_reason = "interrupted"
        raise
    finally:
        level.end_ns = now_ns()
        level.finished = True
    return level
