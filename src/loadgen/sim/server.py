"""The simulator's HTTP face: llama-server's routes on aiohttp, over one Scheduler.

Handlers only translate: a request body becomes CompletionParams, the scheduler's events become
the endpoint's JSON or SSE (formats.py), and a chosen fault (faults.py) decides how the bytes go
out. A streaming answer's headers are sent with its first result, as llama-server's are: a
request waiting for a slot, or still in its prompt, has received nothing yet, and an error that
comes before the first token (a context overflow) is a plain JSON error with its HTTP status.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

from ..core.clock import NS_PER_S, now_ns
from . import formats
from .embeddings import NOT_SUPPORTED, Embedder, InvalidInput, texts_of
from .faults import (
    FAULT_ERRORS,
    GARBAGE_METRICS,
    MID_STREAM_ERROR,
    FaultConfig,
    FaultKind,
    FaultRule,
    close_connection,
    drip,
    malformed,
    reset_connection,
)
from .http_threads import HttpThreads
from .metrics import ServerMetrics
from .params import Api, InvalidRequest, parse_request
from .profile import Profile
from .scheduler import Scheduler
from .task import ErrorEvent, FinalEvent, Task, TokenEvent
from .tokenizer import pieces, token_id

JSON_TYPE = "application/json; charset=utf-8"
# Streamed chunks a mid-stream fault lets through before it strikes (fewer if the answer ends sooner).
FAULT_AFTER_CHUNKS = 2

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class SimOptions:
    slots: int = 4
    metrics: bool = True
    time_scale: float = 1.0
    seed: int = 0
    load_seconds: float = 0.0  # model time, so scaled like every other model duration
    faults: FaultConfig = field(default_factory=FaultConfig)
    threads_http: int | None = None  # a fixed pool of HTTP threads (http_threads.py); None: no limit
    keep_alive_s: float = 5.0  # how long an idle keep-alive connection keeps its HTTP thread
    cache_ram_tokens: int = 0  # the host prompt cache's capacity (host_cache.py); 0: none
    # Reasoning mode: the first N tokens of every chat, Responses and Messages answer are thinking,
    # streamed as those APIs' reasoning deltas (formats.Dialect); 0: no reasoning.
    reasoning_tokens: int = 0
    # llama-server's --embeddings and --reranking: /v1/embeddings and /v1/rerank served (sim/embeddings.py),
    # else answered with its 501.
    embeddings: bool = False
    reranking: bool = False

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise ValueError("slots must be at least 1")
        if self.time_scale <= 0:
            raise ValueError("time_scale must be positive")
        if self.load_seconds < 0:
            raise ValueError("load_seconds must not be negative")
        if self.threads_http is not None and self.threads_http < 1:
            raise ValueError("threads_http must be at least 1")


def json_response(obj: object, status: int = 200) -> web.Response:
    return web.Response(status=status, body=formats.dumps(obj), headers={"Content-Type": JSON_TYPE})


def error_response(status: int, message: str, type_: str, **extra: object) -> web.Response:
    return json_response(formats.error(status, message, type_, **extra), status)


class SimServer:
    """One simulated llama-server: its scheduler, its counters and its routes."""

    def __init__(self, profile: Profile, options: SimOptions):
        self.profile = profile
        self.options = options
        self.metrics = ServerMetrics()
        self.scheduler = Scheduler(profile, options.slots, time_scale=options.time_scale, seed=options.seed,
                                   metrics=self.metrics, cache_ram_tokens=options.cache_ram_tokens)
        self.started_unix = int(time.time())
        self.ready_at_ns = now_ns() + round(options.load_seconds * options.time_scale * NS_PER_S)
        self._n_requests = 0  # completion requests so far: the index faults are chosen by
        self._n_scrapes = 0
        self.http_threads = (HttpThreads(options.threads_http, options.keep_alive_s)
                             if options.threads_http is not None else None)
        self.embedder = Embedder(profile, options.slots, options.time_scale, self.metrics)

    def app(self) -> web.Application:
        gates = [self._gate] if self.http_threads is None else [self.http_threads.middleware, self._gate]
        app = web.Application(middlewares=gates)
        app.on_response_prepare.append(_llama_headers)
        app.router.add_get("/health", self.get_health)
        app.router.add_get("/v1/health", self.get_health)
        app.router.add_get("/props", self.get_props)
        app.router.add_get("/slots", self.get_slots)
        app.router.add_get("/metrics", self.get_metrics)
        app.router.add_get("/models", self.get_models)
        app.router.add_get("/v1/models", self.get_models)
        app.router.add_post("/tokenize", self.post_tokenize)
        for api in Api:
            app.router.add_post(api.value, self._completion_route(api))
        app.router.add_post("/completions", self._completion_route(Api.NATIVE))
        app.router.add_post("/chat/completions", self._completion_route(Api.OAI_CHAT))
        for path in ("/v1/embeddings", "/embeddings"):
            app.router.add_post(path, self.post_embeddings)
        for path in ("/v1/rerank", "/rerank", "/v1/reranking", "/reranking"):
            app.router.add_post(path, self.post_rerank)
        return app

    @web.middleware
    async def _gate(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if now_ns() < self.ready_at_ns:
            return json_response(formats.LOADING, 503)
        try:
            return await handler(request)
        except web.HTTPNotFound:
            return json_response(formats.NOT_FOUND, 404)

    # --- management endpoints ------------------------------------------------------------------

    async def get_health(self, request: web.Request) -> web.Response:
        return json_response({"status": "ok"})

    async def get_props(self, request: web.Request) -> web.Response:
        return json_response(formats.props(self.profile, self.options.slots, self.options.metrics))

    async def get_slots(self, request: web.Request) -> web.Response:
        if request.query.get("fail_on_no_slot") and self.scheduler.n_processing == len(self.scheduler.slots):
            return error_response(503, "no slot available", "unavailable_error")
        return json_response([formats.slot_json(slot) for slot in self.scheduler.slots])

    async def get_models(self, request: web.Request) -> web.Response:
        return json_response(formats.models(self.profile))

    async def get_metrics(self, request: web.Request) -> web.Response:
        if not self.options.metrics:
            return error_response(501, "This server does not support metrics endpoint. Start it with `--metrics`",
                                  "not_supported_error")
        index, self._n_scrapes = self._n_scrapes, self._n_scrapes + 1
        if self.options.faults.for_scrape(self.options.seed, index) is not None:  # garbage_metrics
            return web.Response(body=GARBAGE_METRICS, headers={"Content-Type": "text/plain"})
        text = self.metrics.scrape(processing=self.scheduler.n_processing, deferred=self.scheduler.n_deferred)
        return web.Response(body=text.encode(), headers={"Content-Type": "text/plain; version=0.0.4",
                                                          "Process-Start-Time-Unix": str(self.started_unix)})

    async def post_tokenize(self, request: web.Request) -> web.Response:
        body = await _read_json(request)
        if isinstance(body, web.Response):
            return body
        content = body.get("content") if isinstance(body, dict) else None
        text = content if isinstance(content, str) else ""
        if isinstance(body, dict) and body.get("with_pieces") is True:
            return json_response({"tokens": [{"id": token_id(p), "piece": p} for p in pieces(text)]})
        return json_response({"tokens": [token_id(p) for p in pieces(text)]})

    # --- embeddings and rerank (sim/embeddings.py) --------------------------------------------------

    async def post_embeddings(self, request: web.Request) -> web.Response:
        return await self._answer_texts(request, rerank=False)

    async def post_rerank(self, request: web.Request) -> web.Response:
        return await self._answer_texts(request, rerank=True)

    async def _answer_texts(self, request: web.Request, *, rerank: bool) -> web.Response:
        if not (self.options.reranking if rerank else self.options.embeddings):
            return error_response(501, NOT_SUPPORTED["rerank" if rerank else "embeddings"], "not_supported_error")
        body = await _read_json(request)
        if isinstance(body, web.Response):
            return body
        try:
            query, texts = texts_of(body, rerank)
        except InvalidInput as exc:
            return error_response(400, str(exc), "invalid_request_error")
        model = self.profile.model_alias
        answer = await (self.embedder.rerank(query, texts, model) if rerank else self.embedder.embeddings(texts, model))
        return json_response(answer)

    # --- completions ---------------------------------------------------------------------------

    def _completion_route(self, api: Api) -> Handler:
        async def route(request: web.Request) -> web.StreamResponse:
            return await self.completion(request, api)
        return route

    async def completion(self, request: web.Request, api: Api) -> web.StreamResponse:
        index, self._n_requests = self._n_requests, self._n_requests + 1
        fault = self.options.faults.for_request(self.options.seed, index)
        body = await _read_json(request)
        if fault is not None:
            early = await _early_fault(request, fault)
            if early is not None:
                return early
        if isinstance(body, web.Response):
            return body
        try:
            params = parse_request(body, api, self.options.slots, self.profile.image_tokens)
        except InvalidRequest as exc:
            return error_response(400, str(exc), "invalid_request_error")
        task = self.scheduler.submit(params)
        dialect = formats.DIALECTS[api](task, self.profile.model_alias)
        dialect.reasoning = self.options.reasoning_tokens
        finished = False
        try:
            if params.stream:
                response, finished = await self._stream(request, task, dialect, fault)
            else:
                response, finished = await self._answer(request, task, dialect, fault)
            return response
        finally:
            if not finished:  # the client went away, or a fault cut the connection
                self.scheduler.cancel(task)

    async def _answer(self, request: web.Request, task: Task, dialect: formats.Dialect,
                      fault: FaultRule | None) -> tuple[web.StreamResponse, bool]:
        event = await task.next_event()
        while isinstance(event, TokenEvent):  # not sent for non-streaming tasks; skipped to be safe
            event = await task.next_event()
        if isinstance(event, ErrorEvent):
            return json_response({"error": event.error}, event.status), True
        if fault is not None and fault.kind is FaultKind.ERROR_MID_STREAM:
            return error_response(*MID_STREAM_ERROR), True
        return await _send_body(request, formats.dumps(dialect.final(event.result)), fault), True

    async def _stream(self, request: web.Request, task: Task, dialect: formats.Dialect,
                      fault: FaultRule | None) -> tuple[web.StreamResponse, bool]:
        event = await task.next_event()
        if isinstance(event, ErrorEvent):
            return json_response({"error": event.error}, event.status), True
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        writer = _SseWriter(request, response, fault)
        try:
            while True:
                if isinstance(event, TokenEvent):
                    if not await writer.write_all(dialect.partial(event)):
                        return response, False
                elif isinstance(event, FinalEvent):
                    if writer.drops_final:
                        break
                    if not await writer.write_all(dialect.final_stream(event.result), final=True):
                        return response, True
                    if dialect.has_done_marker:
                        await response.write(formats.SSE_DONE)
                    break
                else:  # a mid-stream error (shutdown) is an SSE event, and the stream ends there
                    await response.write(formats.sse({"error": event.error}))
                    break
                event = await task.next_event()
            await response.write_eof()
        except ConnectionResetError:
            return response, False
        return response, True


async def _send_body(request: web.Request, body: bytes, fault: FaultRule | None) -> web.StreamResponse:
    """A JSON answer, unless a body fault mangles it: cut in half (malformed_json); promised in full
    by Content-Length but cut off by a FIN (truncated_body) or a RST (reset_mid_stream); or sent in
    slow pieces (slow_drip)."""
    kind = fault.kind if fault is not None else None
    if kind is FaultKind.MALFORMED_JSON:
        return web.Response(body=malformed(body), headers={"Content-Type": JSON_TYPE})
    if fault is None or kind not in (FaultKind.TRUNCATED_BODY, FaultKind.RESET_MID_STREAM, FaultKind.SLOW_DRIP):
        return web.Response(body=body, headers={"Content-Type": JSON_TYPE})
    response = web.StreamResponse(headers={"Content-Type": JSON_TYPE})
    response.content_length = len(body)
    await response.prepare(request)
    if kind is FaultKind.SLOW_DRIP:
        await drip(response, body, fault.seconds)
        await response.write_eof()
    else:
        await response.write(body[: len(body) // 2])
        (close_connection if kind is FaultKind.TRUNCATED_BODY else reset_connection)(request)
    return response


async def _early_fault(request: web.Request, fault: FaultRule) -> web.StreamResponse | None:
    """Act on a fault that strikes before the request reaches a slot; the answer that replaces the
    normal one, or None when the request goes on (after a first-byte stall, or a fault for later)."""
    if fault.kind is FaultKind.FIRST_BYTE_STALL:
        await asyncio.sleep(fault.seconds)
    elif fault.kind is FaultKind.HTTP_503:
        return json_response(formats.LOADING, 503)  # what llama-server answers while it loads
    elif fault.kind in FAULT_ERRORS:
        status, type_, message = FAULT_ERRORS[fault.kind]
        return error_response(status, message, type_)
    elif fault.kind is FaultKind.RESET_BEFORE_HEADERS:
        reset_connection(request)
        return web.Response()  # never sent: the connection is gone
    return None


async def _llama_headers(request: web.Request, response: web.StreamResponse) -> None:
    """The headers llama-server's HTTP layer adds (in place of aiohttp's own Server header)."""
    response.headers["Server"] = "llama.cpp"
    response.headers["Access-Control-Allow-Origin"] = request.headers.get("Origin", "")
    if response.headers.get("Content-Type") == "text/event-stream":
        response.headers["X-Accel-Buffering"] = "no"  # tells nginx not to buffer the stream


class _SseWriter:
    """Writes SSE events, letting a stream fault act on them."""

    def __init__(self, request: web.Request, response: web.StreamResponse, fault: FaultRule | None):
        self._request = request
        self._response = response
        self._kind = fault.kind if fault is not None else None
        self._drip_s = fault.seconds if fault is not None else 0.0
        self._written = 0

    @property
    def drops_final(self) -> bool:
        return self._kind is FaultKind.STREAM_NO_FINAL

    async def write_all(self, objects: list[dict[str, object]], final: bool = False) -> bool:
        """Write the events; False when a fault cut the connection or ended the stream instead."""
        for obj in objects:
            if self._kind in (FaultKind.RESET_MID_STREAM, FaultKind.TRUNCATED_BODY) and (
                    final or self._written >= FAULT_AFTER_CHUNKS):
                (reset_connection if self._kind is FaultKind.RESET_MID_STREAM else close_connection)(self._request)
                return False
            if self._kind is FaultKind.ERROR_MID_STREAM and (final or self._written >= FAULT_AFTER_CHUNKS):
                status, type_, message = MID_STREAM_ERROR
                await self._response.write(formats.sse(formats.error(status, message, type_)))
                await self._response.write_eof()
                return False
            data = formats.sse(obj)
            if self._kind is FaultKind.MALFORMED_JSON and self._written == 0:
                data = b"data: " + malformed(formats.dumps(obj)) + b"\n\n"
            if self._kind is FaultKind.SLOW_DRIP:
                await asyncio.sleep(self._drip_s)
            await self._response.write(data)
            self._written += 1
        return True


async def _read_json(request: web.Request) -> object:
    """The request's JSON body, or the 400 llama-server gives for a body that is not JSON."""
    raw = await request.read()
    if not raw.strip():
        return error_response(400, "[json.exception.parse_error.101] parse error at line 1, column 1: attempting to "
                                   "parse an empty input; check that your input string or stream contains the "
                                   "expected JSON", "invalid_request_error")
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        return error_response(400, f"[json.exception.parse_error.101] parse error at line {exc.lineno}, "
                                   f"column {exc.colno}: syntax error while parsing value - {exc.msg}",
                              "invalid_request_error")
    except UnicodeDecodeError:
        return error_response(400, "[json.exception.parse_error.316] invalid UTF-8 byte", "invalid_request_error")


# --- in-process use ----------------------------------------------------------------------------------

@dataclass(slots=True)
class RunningSimulator:
    """A simulator listening on `url` until `stop()`."""

    url: str
    host: str
    port: int
    server: SimServer
    _runner: web.AppRunner
    _loop_task: asyncio.Task[None]

    async def stop(self) -> None:
        self.server.scheduler.stop()
        self._loop_task.cancel()
        try:
            await self._loop_task
        except asyncio.CancelledError:
            pass
        await self._runner.cleanup()

    async def __aenter__(self) -> RunningSimulator:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def start_simulator(profile: Profile, *, host: str = "127.0.0.1", port: int = 0, slots: int = 4,
                          metrics: bool = True, time_scale: float = 1.0, seed: int = 0, load_seconds: float = 0.0,
                          faults: FaultConfig | None = None, reuse_port: bool = False,
                          threads_http: int | None = None, keep_alive_s: float = 5.0,
                          cache_ram_tokens: int = 0, reasoning_tokens: int = 0, embeddings: bool = False,
                          reranking: bool = False) -> RunningSimulator:
    """Start a simulated llama-server on host:port (port 0: a free one) in the running event loop.

    `faults` replaces the profile's own faults; None keeps them. `reuse_port` binds with
    SO_REUSEPORT, as llama-server's HTTP library does. Raises OSError if it cannot bind.
    """
    options = SimOptions(slots=slots, metrics=metrics, time_scale=time_scale, seed=seed, load_seconds=load_seconds,
                         faults=profile.faults if faults is None else faults, threads_http=threads_http,
                         keep_alive_s=keep_alive_s, cache_ram_tokens=cache_ram_tokens,
                         reasoning_tokens=reasoning_tokens, embeddings=embeddings, reranking=reranking)
    server = SimServer(profile, options)
    # handler_cancellation: a client that disconnects cancels its handler, which cancels its task.
    runner = web.AppRunner(server.app(), handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, reuse_port=reuse_port or None)
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bound_port = runner.addresses[0][1]
    url_host = f"[{host}]" if ":" in host else host
    loop_task = asyncio.create_task(server.scheduler.run(), name="loadgen-sim-scheduler")
    return RunningSimulator(f"http://{url_host}:{bound_port}", host, bound_port, server, runner, loop_task)
