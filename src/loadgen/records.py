"""Plain data that crosses modules: one record per request, as recorded.

Field names that come from llama-server keep its spelling (`prompt_n`, `predicted_ms`,
`tokens_predicted`, `stop_type`, `id_slot`, ...). Times are nanoseconds on `clock.now_ns`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

# Error kinds a request can end with. HTTP errors are "http_<status>".
CONNECT_ERROR = "connect_error"  # could not open a connection (refused, DNS, TLS)
DISCONNECTED = "disconnected"  # the server closed or reset the connection before a full response
TIMEOUT = "timeout"  # no complete response within --timeout
INVALID_JSON = "invalid_json"  # a 2xx body that is not the JSON object the API promises
SERVER_ERROR = "server_error"  # a 2xx body that carries an {"error": ...} object
CANCELLED = "cancelled"  # in flight when the run was stopped (Ctrl-C); not the server's fault


class ServerOutcome(msgspec.Struct, frozen=True):
    """What a backend read from one response. `error_kind` is None when it succeeded."""

    error_kind: str | None = None
    error_message: str | None = None
    tokens_predicted: int | None = None
    stop_type: str | None = None
    id_slot: int | None = None
    prompt_n: int | None = None
    prompt_ms: float | None = None
    predicted_n: int | None = None
    predicted_ms: float | None = None
    predicted_per_second: float | None = None
    cache_n: int | None = None


class RequestRecord(msgspec.Struct, frozen=True):
    """One request as loadgen saw it, with the server's own `timings` when it sent them."""

    target: str
    level: int
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
    id_slot: int | None = None
    prompt_n: int | None = None
    prompt_ms: float | None = None
    predicted_n: int | None = None
    predicted_ms: float | None = None
    predicted_per_second: float | None = None
    cache_n: int | None = None
    headers_ns: int | None = None
    prompt_tokens_target: int | None = None  # length asked for (--prompt-tokens, a depth); prompt_n: computed

    @property
    def ok(self) -> bool:
        return self.error_kind is None

    def to_dict(self) -> dict[str, Any]:
        return msgspec.structs.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RequestRecord":
        """Validate and convert; raises msgspec.ValidationError on a wrong field type."""
        return msgspec.convert(data, cls)


def make_record(
    *,
    target: str,
    level: int,
    worker: int,
    seq: int,
    salt: str,
    send_ns: int,
    complete_ns: int,
    status: int | None,
    outcome: ServerOutcome,
    headers_ns: int | None = None,
    prompt_tokens_target: int | None = None,
) -> RequestRecord:
    return RequestRecord(
        target=target,
        level=level,
        worker=worker,
        seq=seq,
        salt=salt,
        send_ns=send_ns,
        complete_ns=complete_ns,
        status=status,
        headers_ns=headers_ns,
        error_kind=outcome.error_kind,
        error_message=outcome.error_message,
        tokens_predicted=outcome.tokens_predicted,
        stop_type=outcome.stop_type,
        id_slot=outcome.id_slot,
        prompt_n=outcome.prompt_n,
        prompt_ms=outcome.prompt_ms,
        predicted_n=outcome.predicted_n,
        predicted_ms=outcome.predicted_ms,
        predicted_per_second=outcome.predicted_per_second,
        cache_n=outcome.cache_n,
        prompt_tokens_target=prompt_tokens_target,
    )


class ProbeSample(msgspec.Struct, frozen=True):
    """One look at a server during a level. Names are llama-server's; None: the endpoint was off."""

    target: str
    level: int
    t_ns: int
    requests_processing: float | None = None
    requests_deferred: float | None = None
    tokens_predicted_total: float | None = None
    prompt_tokens_total: float | None = None
    n_decode_total: float | None = None
    busy_slots: int | None = None  # from /slots: how many have is_processing

    def to_dict(self) -> dict[str, Any]:
        return msgspec.structs.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ProbeSample":
        return msgspec.convert(data, cls)


@dataclass(slots=True)
class LevelRun:
    """The raw outcome of one level on one target: its records and how it ended."""

    target: str
    concurrency: int
    prompt_tokens: int | None = None  # every request's prompt is this many tokens (exact-length prompts)
    records: list[RequestRecord] = field(default_factory=list)
    start_ns: int = 0
    end_ns: int = 0
    stopped_reason: str | None = None  # None: budget used up; else why it stopped early
    finished: bool = False  # False while the level runs (a checkpoint then saves it as in progress)
    server_metrics_before: dict[str, float] | None = None
    server_metrics_after: dict[str, float] | None = None
    probe_samples: list[ProbeSample] = field(default_factory=list)

    def to_simulated_time(self, time_scale: float, origin_ns: int) -> None:
        """Turn a level run against a simulator running at `time_scale` into simulated time.

        A simulator at time_scale 0.05 does 20 s of model work in 1 s, and reports its timings as
        measured (scaled). Dividing every duration by the scale gives the figures of the hardware it
        simulates. Every time is stretched away from one origin, the run's start, so the levels of a
        run stay in order on one time axis.
        """
        origin = origin_ns

        def t(ns: int | None) -> int | None:
            return None if ns is None else origin + round((ns - origin) / time_scale)

        def d(ms: float | None) -> float | None:
            return None if ms is None else ms / time_scale

        self.records[:] = [msgspec.structs.replace(
            r, send_ns=t(r.send_ns), complete_ns=t(r.complete_ns), headers_ns=t(r.headers_ns),
            prompt_ms=d(r.prompt_ms), predicted_ms=d(r.predicted_ms),
            predicted_per_second=None if r.predicted_per_second is None else r.predicted_per_second * time_scale)
            for r in self.records]
        self.probe_samples[:] = [msgspec.structs.replace(s, t_ns=t(s.t_ns)) for s in self.probe_samples]
        self.start_ns, self.end_ns = t(self.start_ns), t(self.end_ns)
