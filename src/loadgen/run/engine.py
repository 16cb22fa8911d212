"""The engine: sends a level's requests, closed loop or open loop, and records each one.

Closed loop (`run_level`): C workers send requests back to back until the level's budget is used.
Open loop (`run_open_level`): requests leave at precomputed intended times (see `schedule`),
whatever the server's answers, optionally capped at a number in flight.

It knows no server API (a `Backend` builds and reads bodies) and no HTTP library (a `Transport`
moves bytes). Everything it records is appended to a `LevelRun` the caller owns, so a run that is
cancelled (Ctrl-C) or whose server dies still has every record up to that moment.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ..client.backends import Backend, ConversationBackend
from ..client.backends.conversation import History
from ..client.sse import EventReader, StreamReader
from ..client.transport import Transport, TransportError
from ..core import records
from ..core.clock import now_ns
from ..core.records import LevelRun, RequestRecord, ServerOutcome, make_record
from .salts import new_salt

if TYPE_CHECKING:  # for annotations only (run/schedule.py's offsets)
    import numpy as np

# A target is given up when this many requests in a row could not even connect.
CONNECT_FAILURES_BEFORE_DOWN = 3


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """How a level treats salts and failures. The defaults are a sweep's.

    salt                   makes each request's salt (`new_decimal_salt` for exact prompt lengths;
                           None: `new_salt`)
    give_up_after          the level stops with "target down" after this many connect failures in a
                           row; None never gives up (a soak rides out a server restart)
    pause_after_connect_error_s
                           closed loop: a worker whose request could not connect (refused, or no
                           connection within the timeout) waits this long before its next one, so a
                           server that is down is not hammered. Only then: a live server's HTTP
                           errors are part of the load it is offered, and pausing after them would
                           measure the pause (a server failing 30% of requests lost 3/4 of its load)
    """

    salt: Callable[[], str] | None = None
    give_up_after: int | None = CONNECT_FAILURES_BEFORE_DOWN
    pause_after_connect_error_s: float = 0.0


DEFAULT_OPTIONS = EngineOptions()


class Observer(Protocol):
    def level_started(self, level: LevelRun, requests: int | None, duration_s: float | None) -> None: ...

    def request_done(self, record: RequestRecord) -> None: ...


def requests_done(obs: Observer, batch: Sequence[RequestRecord]) -> None:
    """Tell `obs` of records that completed elsewhere (a worker process's), at once when it can
    take a batch (`requests_done`), else one by one."""
    many = getattr(obs, "requests_done", None)
    if many is not None:
        many(batch)
        return
    one = obs.request_done
    for record in batch:
        one(record)


class NullObserver:
    def level_started(self, level: LevelRun, requests: int | None, duration_s: float | None) -> None:
        pass

    def request_done(self, record: RequestRecord) -> None:
        pass


class _Sender:
    """Sends one request and appends its record: the part both loops share.

    This runs once per request, thousands of times a second against a fast server, so it is
    written for speed: attributes read once, records built positionally, streaming apart.
    """

    __slots__ = ("level", "transport", "backend", "obs", "options", "salt", "connect_failures", "_key", "_lora", "_model",
                 "_request", "_build", "_parse", "_parse_at")

    def __init__(self, level: LevelRun, transport: Transport, backend: Backend, obs: Observer,
                 options: EngineOptions = DEFAULT_OPTIONS):
        self.level, self.transport, self.backend, self.obs = level, transport, backend, obs
        self.options = options
        self.salt = options.salt or new_salt
        self.connect_failures = 0
        self._key = level.level
        self._request, self._build, self._parse = transport.request, backend.build, backend.parse
        # A backend that judges an answer by its request number (run/answer_check.py's check under load)
        self._parse_at = getattr(backend, "parse_at", None)
        # --lora-mix (client/backends/lora.py): the adapter each seq asks for, kept on its record
        self._lora = getattr(backend, "lora_label", None)
        # --models (client/backends/router.py): the router model each seq names, kept on its record
        self._model = getattr(backend, "model_label", None) or getattr(getattr(backend, "inner", None),
                                                                       "model_label", None)

    async def send(self, worker: int, seq: int, intended_ns: int | None = None) -> str | None:
        """Send request `seq`, record it; its error kind, None when it succeeded."""
        backend = self.backend
        if backend.stream:
            return await self._send_stream(worker, seq, intended_ns)
        level = self.level
        salt = self.salt()
        body = self._build(salt, seq)
        in_flight = level.in_flight
        send_ns = now_ns()
        in_flight[seq] = (worker, salt, send_ns, intended_ns)
        try:
            response = await self._request(backend.method, backend.path, body)
        except TransportError as exc:
            self._client_limit(exc)
            return self._done(worker, seq, salt, send_ns, now_ns(), None, None, intended_ns, None,
                              ServerOutcome(error_kind=exc.kind, error_message=exc.message))
        except asyncio.CancelledError:
            self._cancelled(worker, seq, salt, send_ns, intended_ns, None)
            raise
        status = response.status
        parse_at = self._parse_at
        outcome = self._parse(status, response.body) if parse_at is None else parse_at(seq, status, response.body)
        return self._done(worker, seq, salt, send_ns, response.complete_ns, status, response.headers_ns,
                          intended_ns, None, outcome, response.connect_us, response.tls_us)

    async def _send_stream(self, worker: int, seq: int, intended_ns: int | None, salt: str = "",
                           body: bytes | None = None, events: EventReader | None = None) -> str | None:
        """Streamed: the backend's body for `seq` with a new salt, or the `body` (salted with `salt`)
        and `events` reader a caller built (a conversation's turn, `TurnSender`)."""
        level, backend = self.level, self.backend
        if body is None:
            salt = self.salt()
            body = self._build(salt, seq)
        stream = StreamReader(events or backend.event_reader())
        send_ns = now_ns()
        level.in_flight[seq] = (worker, salt, send_ns, intended_ns)
        try:
            response = await self._request(backend.method, backend.path, body, stream.on_chunk)
        except TransportError as exc:
            self._client_limit(exc)
            return self._done(worker, seq, salt, send_ns, now_ns(), None, None, intended_ns, stream,
                              ServerOutcome(error_kind=exc.kind, error_message=exc.message))
        except asyncio.CancelledError:
            self._cancelled(worker, seq, salt, send_ns, intended_ns, stream)
            raise
        status, complete_ns = response.status, response.complete_ns
        if status >= 300 or stream.not_a_stream:
            # An error before the stream started, a server that ignored `stream` (plain JSON), or
            # no event stream at all (an HTML page): read as a whole body, as the backend reads one.
            outcome = backend.parse(status, stream.raw_prefix)
        else:
            outcome = stream.finish(complete_ns)
        return self._done(worker, seq, salt, send_ns, complete_ns, status, response.headers_ns, intended_ns,
                          stream, outcome, response.connect_us, response.tls_us)

    def _client_limit(self, exc: TransportError) -> None:
        """A request that failed on this client's own limit (open files, local ports) ends the level
        at once, its message the reason (what to do included), so it is never "target down"."""
        if exc.client_limit and self.level.stopped_reason is None:
            self.level.stopped_reason = exc.message

    def _cancelled(self, worker: int, seq: int, salt: str, send_ns: int, intended_ns: int | None,
                   stream: StreamReader | None) -> None:
        self._append(worker, seq, salt, send_ns, now_ns(), None, None, intended_ns, stream, ServerOutcome(
            error_kind=records.CANCELLED, error_message="in flight when the run was stopped"))

    def _done(self, worker: int, seq: int, salt: str, send_ns: int, complete_ns: int, status: int | None,
              headers_ns: int | None, intended_ns: int | None, stream: StreamReader | None,
              outcome: ServerOutcome, connect_us: int | None = None, tls_us: int | None = None) -> str | None:
        """Record a finished request, tell the observer, count connect failures; the error kind."""
        self.obs.request_done(self._append(worker, seq, salt, send_ns, complete_ns, status, headers_ns,
                                           intended_ns, stream, outcome, connect_us, tls_us))
        kind = outcome.error_kind
        if kind is None:
            self.connect_failures = 0
            return None
        if kind == records.CONNECT_ERROR:
            self.connect_failures += 1
            give_up_after, level = self.options.give_up_after, self.level
            if give_up_after is not None and self.connect_failures >= give_up_after and level.stopped_reason is None:
                level.stopped_reason = f"target down: {outcome.error_message}"
        else:
            self.connect_failures = 0
        return kind

    def _append(self, worker: int, seq: int, salt: str, send_ns: int, complete_ns: int, status: int | None,
                headers_ns: int | None, intended_ns: int | None, stream: StreamReader | None,
                outcome: ServerOutcome, connect_us: int | None = None, tls_us: int | None = None) -> RequestRecord:
        level = self.level
        level.in_flight.pop(seq, None)  # abandon() may have recorded it already
        if intended_ns is None:
            intended_ns = send_ns
        shapes = level.shapes
        if shapes:  # a workload: the lengths this request asked for (the backend built its body so)
            shape = shapes[seq % len(shapes)]
            prompt_tokens, n_predict = shape.prompt_tokens, shape.n_predict
        else:
            prompt_tokens, n_predict = level.prompt_tokens, None
        lora = None if self._lora is None else self._lora(seq)
        model = None if self._model is None else self._model(seq)
        if stream is None:
            record = make_record(level.target, self._key, worker, seq, salt, send_ns, complete_ns, status, outcome,
                                 headers_ns, intended_ns, None, None, None, None, prompt_tokens, connect_us,
                                 tls_us, n_predict, None, level.request_class, lora, model)
        else:  # content event times (none when no content came)
            record = make_record(level.target, self._key, worker, seq, salt, send_ns, complete_ns, status, outcome,
                                 headers_ns, intended_ns, stream.first_ns, stream.last_ns,
                                 stream.gaps_us.tolist() if stream.chunks else None, stream.chunks,
                                 prompt_tokens, connect_us, tls_us, n_predict, stream.first_answer_ns,
                                 level.request_class, lora, model)
        level.records.append(record)  # the one point a completed record passes (core/recordsink.py)
        return record


class TurnSender:
    """Sends a conversation's turns (run/multiturn.py) down the one path a level's requests take:
    the backend builds each turn's body from the history, the transport sends it, the stream is read
    and the request recorded (a `RequestRecord` in `level`, told to `obs`) exactly as `run_level`'s.
    A connect failure never stops the level: a conversation stops at its own first failed turn."""

    def __init__(self, level: LevelRun, transport: Transport, backend: ConversationBackend,
                 obs: Observer | None = None) -> None:
        self._backend = backend
        self._sender = _Sender(level, transport, backend, obs or NullObserver(), EngineOptions(give_up_after=None))

    async def send(self, worker: int, seq: int, salt: str, history: History, message: str,
                   id_slot: int | None = None) -> str | None:
        """Send turn `seq` (of user `worker`) and record it; the answer's text, or None when the turn
        failed (its record says how)."""
        backend = self._backend
        events = backend.answer_reader()
        kind = await self._sender._send_stream(worker, seq, None, salt,
                                               backend.build_turn(salt, history, message, id_slot), events)
        return None if kind is not None else events.answer


async def run_level(
    level: LevelRun,
    transport: Transport,
    backend: Backend,
    *,
    requests: int | None,
    duration_s: float | None,
    observer: Observer | None = None,
    options: EngineOptions = DEFAULT_OPTIONS,
    stagger_s: float = 0.0,
    stop: asyncio.Event | None = None,
) -> LevelRun:
    """Closed loop: `level.concurrency` workers until `requests` are sent or `duration_s` has passed
    (or `stop` is set: levels sent side by side end together, run/classes.py).

    With `stagger_s` 0 every worker sends its first request at the level's start. Otherwise worker
    i's first send waits until start + i × stagger_s / C, spreading the first sends evenly over
    the stagger: requests of one shape started together stay in phase (every prefill collides with
    the others'), started apart they do not. Each worker's first request is its own (seq = its
    index), so a request budget is never used up before the last worker starts.

    In-flight requests at the deadline are allowed to finish and are recorded. On cancellation each
    worker records its in-flight request as `cancelled` before the cancellation propagates.
    """
    if requests is None and duration_s is None:
        raise ValueError("a level needs a request count or a duration")
    obs = observer or NullObserver()
    obs.level_started(level, requests, duration_s)
    sender = _Sender(level, transport, backend, obs, options)
    pause_ns = int(options.pause_after_connect_error_s * 1e9)
    first_seqs = level.concurrency if requests is None else min(level.concurrency, requests)
    issued = first_seqs  # seqs below this are the workers' first requests
    level.start_ns = now_ns()
    deadline = level.start_ns + int(duration_s * 1e9) if duration_s is not None else None
    stagger_step_ns = int(stagger_s * 1e9) / max(1, level.concurrency)

    async def worker(index: int) -> None:
        nonlocal issued
        if stagger_step_ns:
            await asyncio.sleep(max(0, level.start_ns + int(index * stagger_step_ns) - now_ns()) / 1e9)
        seq = index if index < first_seqs else None
        while level.stopped_reason is None:
            if seq is None:
                if requests is not None and issued >= requests:
                    return
                seq = issued
                issued += 1
            if (deadline is not None and now_ns() >= deadline) or (stop is not None and stop.is_set()):
                return
            outcome = await sender.send(index, seq)
            seq = None
            if outcome == records.CONNECT_ERROR and pause_ns:
                until = now_ns() + pause_ns if deadline is None else min(now_ns() + pause_ns, deadline)
                await asyncio.sleep(max(0, until - now_ns()) / 1e9)

    await _run_tasks(level, [asyncio.ensure_future(worker(i)) for i in range(level.concurrency)])
    return level


async def run_open_level(
    level: LevelRun,
    transport: Transport,
    backend: Backend,
    offsets_ns: Sequence[int] | np.ndarray,  # a trace's times, or run/schedule.py's int64 array
    *,
    max_in_flight: int | None = None,
    observer: Observer | None = None,
    options: EngineOptions = DEFAULT_OPTIONS,
    start_ns: int | None = None,
    stop: asyncio.Event | None = None,
) -> LevelRun:
    """Open loop: request i is due at level start + offsets_ns[i], whatever the answers so far
    (none is sent once `stop` is set). The level starts now, or at `start_ns` (this machine's
    monotonic clock): worker processes sharing one schedule share its start (run/workers/merge.py).
    Each record keeps its intended send time, so latency counts from when the request should have
    left. With `max_in_flight`, a due request waits for a free place; it is sent late, never
    skipped, and its latency still counts from its intended time. Stopped, every request in flight
    is recorded as `cancelled`; the unsent are `level.scheduled` less the records (`not_sent`)."""
    obs = observer or NullObserver()
    obs.level_started(level, len(offsets_ns), None)
    sender = _Sender(level, transport, backend, obs, options)
    gate = asyncio.Semaphore(max_in_flight) if max_in_flight else None
    in_flight: set[asyncio.Task] = set()
    level.scheduled = len(offsets_ns)
    level.start_ns = start = now_ns() if start_ns is None else start_ns

    async def one(seq: int, intended_ns: int) -> None:
        try:
            await sender.send(0, seq, intended_ns)
        finally:
            if gate is not None:
                gate.release()

    async def dispatch() -> None:
        try:
            for seq, offset in enumerate(offsets_ns):
                intended = start + int(offset)
                delay = intended - now_ns()
                if delay > 0:
                    await asyncio.sleep(delay / 1e9)
                if gate is not None:
                    await gate.acquire()
                if level.stopped_reason is not None:
                    return
                if stop is not None and stop.is_set():
                    break  # what is in flight still finishes and is recorded
                task = asyncio.ensure_future(one(seq, intended))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
            if in_flight:
                await asyncio.gather(*in_flight)
        finally:
            await _cancel_all(in_flight)  # before `_run_tasks` hands on the level's last records

    await _run_tasks(level, [asyncio.ensure_future(dispatch())])
    return level


async def _cancel_all(tasks: set[asyncio.Task]) -> None:
    """Cancel `tasks` and wait until each has ended (each send records itself as cancelled), even
    when the caller itself is being cancelled. A level's dispatcher does it before the level hands
    on its last records: a record appended after that waited for a flush that never came (a
    Ctrl-C in an open loop lost every request in flight)."""
    while tasks:
        pending = list(tasks)
        for t in pending:
            t.cancel()
        await asyncio.wait(pending)
        tasks.difference_update(pending)


async def _run_tasks(level: LevelRun, tasks: list[asyncio.Future]) -> None:
    """Await a level's tasks; on any exit cancel them (each records its request) and close the level."""
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
        level.records_done()
        level.end_ns = now_ns()
        level.finished = True
