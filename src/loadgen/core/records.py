"""Plain data that crosses modules: one record per request, as recorded.

Field names that come from llama-server keep its spelling (`prompt_n`, `predicted_ms`,
`tokens_predicted`, `stop_type`, `id_slot`, ...). Times are nanoseconds on `clock.now_ns`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from .workload import RequestShape

# Error kinds a request can end with. HTTP errors are "http_<status>".
CONNECT_ERROR = "connect_error"  # could not open a connection (refused, DNS, TLS)
DISCONNECTED = "disconnected"  # the server closed or reset the connection before a full response
TIMEOUT = "timeout"  # no complete response within --timeout
# A response that began and then sent nothing for longer than --stall-timeout (a stuck stream, a
# server that stopped decoding): told apart from a timeout, and found in seconds instead of --timeout's
# minutes. The wait before the first byte (a queue, a long prefill) is never a stall.
STALLED = "stalled"
INVALID_JSON = "invalid_json"  # a 2xx body that is not the JSON object the API promises
# How an `invalid_json` record's message starts when the body was not JSON at all (rather than
# JSON of the wrong shape): what a server without the completion endpoint sends (analysis/evidence.py).
NOT_JSON_MESSAGE = "not JSON"
SERVER_ERROR = "server_error"  # a 2xx body that carries an {"error": ...} object
CANCELLED = "cancelled"  # in flight when the run was stopped (Ctrl-C); not the server's fault
# In flight in a `--workers` process that died (its answer died with it); not the server's fault.
# The message says which worker and how it ended (run/workers/parent.py, run/workers/merge.py `lost_requests`).
LOST = "lost"
# Error kinds that are the client's doing: counted apart, neither ok nor failed.
CLIENT_SIDE = frozenset({CANCELLED, LOST})
STREAM_ERROR = "stream_error"  # a stream that carried `data: {"error": ...}` or an unreadable event
TRUNCATED_STREAM = "truncated_stream"  # a stream that ended before its API's final event
# An answer that differs under load from the same input answered alone (analysis/embedding_check.py):
# an embedding pointing elsewhere, a rerank request's documents out of their order or score. The
# message names the input (its check index and the start of its text).
EMBEDDING_MISMATCH = "embedding_mismatch"
RANK_MISMATCH = "rank_mismatch"
# A structured-output or tool-call answer that does not parse or match its schema (core/answer_check.py).
INVALID_OUTPUT = "invalid_output"


class Usage(msgspec.Struct, frozen=True):
    """The OpenAI-style `usage` object, as the server sent it."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None


class ServerOutcome(msgspec.Struct, frozen=True):
    """What a backend read from one response. `error_kind` is None when it succeeded."""

    error_kind: str | None = None
    error_message: str | None = None
    tokens_predicted: int | None = None
    stop_type: str | None = None
    finish_reason: str | None = None  # the OpenAI APIs' counterpart of stop_type
    id_slot: int | None = None
    prompt_n: int | None = None
    prompt_ms: float | None = None
    predicted_n: int | None = None
    predicted_ms: float | None = None
    predicted_per_second: float | None = None
    cache_n: int | None = None
    usage: Usage | None = None
    draft_n: int | None = None
    draft_n_accepted: int | None = None
    reasoning_tokens: int | None = None
    output_valid: bool | None = None
    tool_calls: int | None = None
    lora_applied: str | None = None


class RequestRecord(msgspec.Struct, frozen=True):
    """One request as loadgen saw it, with the server's own `timings` when it sent them."""

    target: str
    level: int | float  # the level's concurrency (closed loop) or rate in requests/s (open loop)
    worker: int
    seq: int
    salt: str
    send_ns: int
    complete_ns: int
    status: int | None = None
    error_kind: str | None = None
    error_message: str | None = None
    tokens_predicted: int | None = None
    stop_type: str | None = None
    finish_reason: str | None = None  # the OpenAI APIs' counterpart of stop_type
    id_slot: int | None = None
    prompt_n: int | None = None
    prompt_ms: float | None = None
    predicted_n: int | None = None
    predicted_ms: float | None = None
    predicted_per_second: float | None = None
    cache_n: int | None = None
    usage: Usage | None = None
    # Speculative decoding (llama-server's `timings`): tokens drafted for this request and of those
    # accepted. None: the server sent none (it drafted nothing, or does not speculate; older files).
    draft_n: int | None = None
    draft_n_accepted: int | None = None
    # Reasoning models: of the output tokens, how many were thinking (the API's usage details when
    # it gives them, else the streamed reasoning events counted). None: no reasoning was seen.
    reasoning_tokens: int | None = None
    # A structured-output or tools run (core/answer_check.py): True, the answer was judged valid;
    # False, broken (error kind invalid_output); None, not judged (no check asked, cut at length, no
    # tool call). tool_calls: how many the answer made (None: no tools offered, or none read).
    output_valid: bool | None = None
    tool_calls: int | None = None
    # --lora-mix (core/lora_mix.py): the adapters the server says it applied to this request
    # (/completion's `generation_settings.lora`: ids at a non-zero scale joined by "+", or "none").
    # None: no mix, or an API whose answer does not say (the OpenAI ones).
    lora_applied: str | None = None
    headers_ns: int | None = None
    # Open loop: when the schedule said to send it (latencies count from here). Closed loop: send_ns.
    intended_ns: int | None = None
    # Streaming only: arrival of the first and last content events, the gaps between successive
    # content events (µs, one per event after the first) and how many content events came.
    first_token_ns: int | None = None
    last_token_ns: int | None = None
    chunk_gaps_us: list[int] | None = None
    chunks: int | None = None
    prompt_tokens_target: int | None = None  # length asked for (--prompt-tokens, a depth); prompt_n: computed
    # The request opened its connection (its latency includes that): how long connecting took, µs,
    # and of that the TLS handshake (None when the transport cannot tell it apart). None: it went
    # out on an open keep-alive connection (reused, or opened before the level's clock started).
    connect_us: int | None = None
    tls_us: int | None = None
    # A workload (core/workload.py): the answer length this request asked for (None: the run's one
    # n_predict, in run.json's config). predicted_n: what it got.
    n_predict_target: int | None = None
    # Streaming, when reasoning came first: arrival of the first answer (non-reasoning) content
    # event. None without reasoning (the first answer token is then first_token_ns) or when the
    # stream held no answer at all (the output cap was reached while thinking).
    first_answer_ns: int | None = None
    # A run of request classes (core/request_class.py): the class this request belongs to; None: none.
    request_class: str | None = None
    # --lora-mix: the adapter this request asked for ("0", "1", ... or "none"); None: no mix.
    lora: str | None = None
    # --models (core/model_mix.py): the router model this request named in its `model` field; None: no mix.
    model: str | None = None

    @property
    def ok(self) -> bool:
        return self.error_kind is None

    @property
    def start_ns(self) -> int:
        """Where latencies count from: the intended send time when there was a schedule."""
        return self.send_ns if self.intended_ns is None else self.intended_ns

    @property
    def output_tokens(self) -> int | None:
        """Generated tokens as the server counted them (never the chunk count)."""
        if self.predicted_n is not None:
            return self.predicted_n
        if self.tokens_predicted is not None:
            return self.tokens_predicted
        return self.usage.completion_tokens if self.usage is not None else None

    def to_dict(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RequestRecord:
        """Validate and convert; raises msgspec.ValidationError on a wrong field type. A level of
        "inf" (--rate inf, as `encode_lines` writes it) is math.inf."""
        if data.get("level") == "inf":
            data = {**data, "level": math.inf}
        return msgspec.convert(data, cls)


_INF_LEVEL = (b'"level":null', b'"level":"inf"')


def encode_lines(encode: Callable[[Sequence[Any]], bytes], batch: Sequence[RequestRecord | ProbeSample]) -> bytes:
    """A batch of records or probe samples as JSON lines (`encode`: a msgspec encoder's encode_lines).
    JSON has no infinity and msgspec writes one as null, so the level of a --rate inf level's record
    is written "inf" (`from_dict` reads it back); a level is never null otherwise, and the text
    cannot occur inside a JSON string, whose quotes are escaped."""
    lines = encode(batch)
    if batch and any(isinstance(r.level, float) and math.isinf(r.level) for r in batch):
        lines = lines.replace(*_INF_LEVEL)
    return lines


def make_record(
    target: str,
    level: int | float,
    worker: int,
    seq: int,
    salt: str,
    send_ns: int,
    complete_ns: int,
    status: int | None,
    outcome: ServerOutcome,
    headers_ns: int | None = None,
    intended_ns: int | None = None,
    first_token_ns: int | None = None,
    last_token_ns: int | None = None,
    chunk_gaps_us: list[int] | None = None,
    chunks: int | None = None,
    prompt_tokens_target: int | None = None,
    connect_us: int | None = None,
    tls_us: int | None = None,
    n_predict_target: int | None = None,
    first_answer_ns: int | None = None,
    request_class: str | None = None,
    lora: str | None = None,
    model: str | None = None,
) -> RequestRecord:
    # A record is made per request: callers on the hot path pass arguments by position, and the
    # record is built positionally too (msgspec takes positional arguments several times faster
    # than 28 keywords). The outcome's fields sit in the record in the outcome's
    # order (checked below, at import).
    return RequestRecord(target, level, worker, seq, salt, send_ns, complete_ns, status,  # type: ignore[call-arg]  # mypy cannot count a *-spread's fields
                         *msgspec.structs.astuple(outcome), headers_ns, intended_ns, first_token_ns,
                         last_token_ns, chunk_gaps_us, chunks, prompt_tokens_target, connect_us, tls_us,
                         n_predict_target, first_answer_ns, request_class, lora, model)


_OUTCOME_AT = RequestRecord.__struct_fields__.index("error_kind")
assert RequestRecord.__struct_fields__[:_OUTCOME_AT] == (
    "target", "level", "worker", "seq", "salt", "send_ns", "complete_ns", "status")
assert RequestRecord.__struct_fields__[_OUTCOME_AT:_OUTCOME_AT + len(ServerOutcome.__struct_fields__)] == \
    ServerOutcome.__struct_fields__
assert RequestRecord.__struct_fields__[_OUTCOME_AT + len(ServerOutcome.__struct_fields__):] == (
    "headers_ns", "intended_ns", "first_token_ns", "last_token_ns", "chunk_gaps_us", "chunks",
    "prompt_tokens_target", "connect_us", "tls_us", "n_predict_target", "first_answer_ns", "request_class",
    "lora", "model")


class ProbeSample(msgspec.Struct, frozen=True):
    """One look at a server during a level. Names are llama-server's; None: the endpoint was off."""

    target: str
    level: int | float
    t_ns: int
    requests_processing: float | None = None
    requests_deferred: float | None = None
    tokens_predicted_total: float | None = None
    prompt_tokens_total: float | None = None
    n_decode_total: float | None = None
    busy_slots: int | None = None  # from /slots: how many have is_processing
    # From /slots, one per slot: tokens of context its running task holds (n_prompt_tokens +
    # next_token.n_decoded; 0 for an idle slot). None: /slots was off or unreadable.
    slot_context_tokens: list[int] | None = None
    # How long the scrape took (its /metrics and /slots, one after the other), µs: what the probe cost
    # the server's HTTP layer. None in files written before it was recorded.
    scrape_us: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return msgspec.structs.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProbeSample:
        if data.get("level") == "inf":  # --rate inf (`encode_lines`)
            data = {**data, "level": math.inf}
        return msgspec.convert(data, cls)


def level_name(level: int | float, open_loop: bool) -> str:
    """How a level is called in messages: "concurrency 4", "2 req/s" or "rate inf" (--rate inf)."""
    if open_loop and math.isinf(level):
        return "rate inf"
    return f"{level:g} req/s" if open_loop else f"concurrency {level}"


def level_short(level: int | float, open_loop: bool) -> str:
    """How a level is called in tables and lists: "c=4", "2 req/s" or "rate inf"."""
    if open_loop and math.isinf(level):
        return "rate inf"
    return f"{level:g} req/s" if open_loop else f"c={level}"


@dataclass(slots=True)
class LevelRun:
    """The raw outcome of one level on one target: its records and how it ended."""

    target: str
    concurrency: int  # closed loop: workers; open loop: the in-flight cap (0: none)
    rate: float | None = None  # open loop: requests/s; None: closed loop
    # Open loop: added to the run's arrival seed for this level's schedule: the level's repeat on its
    # target (0 the first time a rate runs, 1 the second, ...), so a level run again (a capacity
    # search's repeats) draws new arrivals instead of replaying the same send times.
    seed_offset: int = 0
    prompt_tokens: int | None = None  # every request's prompt is this many tokens (exact-length prompts)
    # A workload's shapes (core/workload.py): request seq asks for shapes[seq % len] (empty: none)
    shapes: tuple[RequestShape, ...] = ()
    # A run of request classes: the class every request of the level belongs to, and the phase
    # ("alone" or "together", core/request_class.py); None: not a run of classes.
    request_class: str | None = None
    phase: str | None = None
    # Completed records: a plain list, or a `recordsink.LevelRecords` streaming them to disk (then
    # `aggregate` holds the level's figures, an `analysis.aggregate.LevelAggregate`).
    records: Any = field(default_factory=list)
    aggregate: Any = None
    tally: Any = None  # a streamed soak's windows (`analysis.soak.SoakTally`)
    slo_tally: Any = None  # --slo: the level's requests judged as they stream (`analysis.slo.SloTally`)
    # --trim: the finished level's records split and their aggregate (`analysis.trim.Trimmed`, a
    # `LevelAggregate`), made once by the results writer and reused at every checkpoint after.
    trimmed: Any = None
    start_ns: int = 0
    end_ns: int = 0
    stopped_reason: str | None = None  # None: budget used up; else why it stopped early
    finished: bool = False  # False while the level runs (a checkpoint then saves it as in progress)
    server_metrics_before: dict[str, float] | None = None
    server_metrics_after: dict[str, float] | None = None
    probe_samples: list[ProbeSample] = field(default_factory=list)
    # The client's own load during the level (see `looplag`); None until it ends.
    loop_lag_p99_ms: float | None = None
    loop_lag_max_ms: float | None = None
    client_cpu_fraction: float | None = None
    # --workers: each process's part of the level and its own load (run/workers/parent.py); None: one process.
    workers: list[dict[str, Any]] | None = None
    # The machine under the level: `core.environment.EnvSample`s at its start, during and at its end
    # (run/machine_sampling.py); empty when the run does not read the machine. A soak's is an
    # `analysis.soak_machine.SoakMachine` (appended to and iterated as a list, folded per window).
    environment: Any = field(default_factory=list)
    # Its requests run in other processes (--workers), so a record may arrive after later-sent ones
    # and `in_flight` knows none of them: a streamed aggregate settles nothing before the level ends.
    remote: bool = False
    # Open loop: how many requests its schedule holds (None: closed loop). Those without a record
    # when the level ends were never sent (`not_sent`: stopped first); a count, not records.
    scheduled: int | None = None
    # Sent and not yet recorded: seq -> (worker, salt, send_ns, intended_ns). Read only by `abandon`.
    in_flight: dict[int, tuple[int, str, int, int | None]] = field(default_factory=dict)

    def abandon(self, at_ns: int) -> None:
        """The run is left at once (a second Ctrl-C): what is in flight is recorded as cancelled and
        a level still running ends as interrupted, so the file written next is a finished one."""
        for seq, (worker, salt, send_ns, intended_ns) in sorted(self.in_flight.items()):
            self.records.append(make_record(
                target=self.target, level=self.level, worker=worker, seq=seq, salt=salt, send_ns=send_ns,
                complete_ns=at_ns, status=None, intended_ns=send_ns if intended_ns is None else intended_ns,
                outcome=ServerOutcome(error_kind=CANCELLED, error_message="in flight when the run was stopped")))
        self.in_flight.clear()
        self.records_done()
        if not self.finished:
            self.stopped_reason = self.stopped_reason or "interrupted"
            self.end_ns, self.finished = at_ns, True

    def records_done(self) -> None:
        """The level sends no more: a streamed level hands on the records it still holds."""
        flush = getattr(self.records, "flush", None)
        if flush is not None:
            flush()

    @property
    def level(self) -> int | float:
        """The level's key in records and results: its concurrency, or its rate when open loop."""
        return self.concurrency if self.rate is None else self.rate

    @property
    def name(self) -> str:
        return level_name(self.level, self.rate is not None)

    def to_simulated_time(self, time_scale: float, origin_ns: int) -> None:
        """Turn a level run against a simulator running at `time_scale` into simulated time.

        A simulator at time_scale 0.05 does 20 s of model work in 1 s, and reports its timings as
        measured (scaled). Dividing every duration by the scale gives the figures of the hardware it
        simulates. Every time is stretched away from one origin, the run's start, so the levels of a
        run stay in order on one time axis.
        """
        if isinstance(self.records, list):  # a streamed level's records were moved as they came
            self.records[:] = [simulated_record(r, time_scale, origin_ns) for r in self.records]
        self.probe_samples[:] = [simulated_sample(s, time_scale, origin_ns) for s in self.probe_samples]
        self.start_ns = _stretch_ns(self.start_ns, time_scale, origin_ns)
        self.end_ns = _stretch_ns(self.end_ns, time_scale, origin_ns)


def _stretch_ns(ns: int, time_scale: float, origin_ns: int) -> int:
    return origin_ns + round((ns - origin_ns) / time_scale)


def _stretch(ns: int | None, time_scale: float, origin_ns: int) -> int | None:
    return None if ns is None else _stretch_ns(ns, time_scale, origin_ns)


def simulated_sample(s: ProbeSample, time_scale: float, origin_ns: int) -> ProbeSample:
    """One probe sample moved to simulated time (see `LevelRun.to_simulated_time`)."""
    return msgspec.structs.replace(s, t_ns=_stretch_ns(s.t_ns, time_scale, origin_ns))


def simulated_record(r: RequestRecord, time_scale: float, origin_ns: int) -> RequestRecord:
    """One record moved to simulated time (see `LevelRun.to_simulated_time`)."""
    def t(ns: int | None) -> int | None:
        return _stretch(ns, time_scale, origin_ns)

    def d(ms: float | None) -> float | None:
        return None if ms is None else ms / time_scale

    return msgspec.structs.replace(
        r, send_ns=t(r.send_ns), complete_ns=t(r.complete_ns), headers_ns=t(r.headers_ns),
        intended_ns=t(r.intended_ns), first_token_ns=t(r.first_token_ns), last_token_ns=t(r.last_token_ns),
        first_answer_ns=t(r.first_answer_ns),
        chunk_gaps_us=None if r.chunk_gaps_us is None else [round(g / time_scale) for g in r.chunk_gaps_us],
        prompt_ms=d(r.prompt_ms), predicted_ms=d(r.predicted_ms),
        predicted_per_second=None if r.predicted_per_second is None else r.predicted_per_second * time_scale)
