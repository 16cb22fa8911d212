"""Fault injection: which requests misbehave, and how each misbehaviour is put on the wire.

A fault is `KIND:SHARE`: that share of completion requests (`/completion`, `/v1/completions`,
`/v1/chat/completions`) gets it; `garbage_metrics` applies to `/metrics` scrapes instead.

    http_500, http_400      at once, that status with llama-server's error shape
    http_503                at once, 503 "Loading model", as a loading llama-server answers
    reset_before_headers    the request is read, then the connection is reset (RST) before any byte
    reset_mid_stream        a stream is reset after 2 events, before its final one; a JSON body halfway
    truncated_body          the same, closed cleanly (FIN): the chunked or Content-Length body is short
    malformed_json          200, but the JSON is cut in half (in a stream: the first event)
    stream_no_final         a stream ends cleanly without its final event and without [DONE]
                            (no effect on a non-streaming request)
    error_mid_stream        a stream sends `data: {"error": ...}` after 2 events and ends there, as
                            llama-server does when a running task fails; a JSON body is a 500 instead
    first_byte_stall:SECONDS[:SHARE]  nothing for SECONDS, then the normal answer
    slow_drip:SHARE[:SECONDS]         SECONDS (default 0.2) before each event, or each of 8 pieces of a body
    garbage_metrics         /metrics answers 200 with text that is not Prometheus

The seconds are wall-clock seconds, untouched by `--time-scale`: they test the client's timeouts,
not the model. A faulty request still runs on a slot unless its fault strikes before (http_*,
reset_before_headers).

Choice is deterministic: completion request number n (from 0, in arrival order) draws
u = Random(f"{seed}:{n}").random() and gets the rule whose slice of [0, 1) holds u, the rules'
shares laid end to end in the order given. So shares add up to at most 1, faults never stack on
one request, and the same seed and arrival order give the same faulty requests.
"""

from __future__ import annotations

import asyncio
import random
import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the requests are the server's; `loadgen sim --help` reads FAULT_KINDS without aiohttp
    from aiohttp import web


class FaultKind(str, Enum):  # noqa: UP042 (StrEnum would change what str() and format() print)
    HTTP_500 = "http_500"
    HTTP_503 = "http_503"
    HTTP_400 = "http_400"
    RESET_BEFORE_HEADERS = "reset_before_headers"
    RESET_MID_STREAM = "reset_mid_stream"
    MALFORMED_JSON = "malformed_json"
    TRUNCATED_BODY = "truncated_body"
    STREAM_NO_FINAL = "stream_no_final"
    ERROR_MID_STREAM = "error_mid_stream"
    FIRST_BYTE_STALL = "first_byte_stall"
    SLOW_DRIP = "slow_drip"
    GARBAGE_METRICS = "garbage_metrics"


FAULT_KINDS = tuple(kind.value for kind in FaultKind)
DEFAULT_DRIP_S = 0.2

# (status, type, message) of the status faults, in llama-server's error shape; http_503 answers
# with the server's own "Loading model" body instead.
FAULT_ERRORS = {
    FaultKind.HTTP_500: (500, "server_error", "simulated fault: internal server error"),
    FaultKind.HTTP_400: (400, "invalid_request_error", "simulated fault: invalid request"),
}
# What error_mid_stream reports, in the stream or as a non-streaming answer's 500.
MID_STREAM_ERROR = (500, "server_error", "simulated fault: the task failed while generating")

# Not Prometheus text: what a proxy error page or a half-written file looks like to a scraper.
GARBAGE_METRICS = b"<html><body><h1>502 Bad Gateway</h1></body></html>\nllamacpp:requests_processing ???\n"


@dataclass(frozen=True, slots=True)
class FaultRule:
    kind: FaultKind
    share: float
    seconds: float = 0.0  # the stall of first_byte_stall, the gap between pieces of slow_drip


@dataclass(frozen=True, slots=True)
class FaultConfig:
    """The faults a simulator injects; empty (no faults) by default."""

    rules: tuple[FaultRule, ...] = ()

    def __post_init__(self) -> None:
        for group in (self._request_rules(), self._metrics_rules()):
            if sum(rule.share for rule in group) > 1.0 + 1e-9:
                raise ValueError("fault shares add up to more than 1")

    def _request_rules(self) -> tuple[FaultRule, ...]:
        return tuple(r for r in self.rules if r.kind is not FaultKind.GARBAGE_METRICS)

    def _metrics_rules(self) -> tuple[FaultRule, ...]:
        return tuple(r for r in self.rules if r.kind is FaultKind.GARBAGE_METRICS)

    def for_request(self, seed: int, index: int) -> FaultRule | None:
        """The fault completion request number `index` gets, or None."""
        return _pick(self._request_rules(), f"{seed}:{index}")

    def for_scrape(self, seed: int, index: int) -> FaultRule | None:
        """The fault `/metrics` scrape number `index` gets, or None."""
        return _pick(self._metrics_rules(), f"{seed}:metrics:{index}")

    @classmethod
    def parse(cls, specs: Iterable[str]) -> FaultConfig:
        return cls(tuple(parse_fault(spec) for spec in specs))


def _pick(rules: tuple[FaultRule, ...], key: str) -> FaultRule | None:
    if not rules:
        return None
    u = random.Random(key).random()
    edge = 0.0
    for rule in rules:
        edge += rule.share
        if u < edge:
            return rule
    return None


def parse_fault(spec: str) -> FaultRule:
    """`KIND:SHARE`, `first_byte_stall:SECONDS[:SHARE]` or `slow_drip:SHARE[:SECONDS]` -> a rule.

    Raises ValueError with a one-line message.
    """
    name, *args = spec.strip().split(":")
    try:
        kind = FaultKind(name)
    except ValueError:
        raise ValueError(f"unknown fault '{name}' (known: {', '.join(FAULT_KINDS)})") from None
    try:
        numbers = [float(arg) for arg in args]
    except ValueError:
        raise ValueError(f"fault '{spec}': arguments must be numbers") from None
    if kind is FaultKind.FIRST_BYTE_STALL:
        if not 1 <= len(numbers) <= 2:
            raise ValueError(f"fault '{spec}': use first_byte_stall:SECONDS[:SHARE]")
        seconds, share = numbers[0], (numbers[1] if len(numbers) == 2 else 1.0)
    elif kind is FaultKind.SLOW_DRIP:
        if len(numbers) > 2:
            raise ValueError(f"fault '{spec}': use slow_drip:SHARE[:SECONDS]")
        share = numbers[0] if numbers else 1.0
        seconds = numbers[1] if len(numbers) == 2 else DEFAULT_DRIP_S
    else:
        if len(numbers) > 1:
            raise ValueError(f"fault '{spec}': use {kind.value}:SHARE")
        share, seconds = (numbers[0] if numbers else 1.0), 0.0
    if not 0.0 < share <= 1.0:
        raise ValueError(f"fault '{spec}': SHARE must be in (0, 1]")
    if seconds < 0:
        raise ValueError(f"fault '{spec}': SECONDS must not be negative")
    return FaultRule(kind, share, seconds)


# --- putting a fault on the wire -------------------------------------------------------------------

def reset_connection(request: web.Request) -> None:
    """Abort the connection with a TCP RST (SO_LINGER 0), as a crashed or killed server would."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass  # the peer is already gone: a plain abort is all that is left to do
    transport.abort()


def close_connection(request: web.Request) -> None:
    """Close the connection cleanly (FIN) in the middle of a body: the client sees it cut short."""
    if request.transport is not None:
        request.transport.close()


def malformed(body: bytes) -> bytes:
    """A JSON text cut in half: still UTF-8, no longer JSON."""
    return body[: max(1, len(body) // 2)]


async def drip(response: web.StreamResponse, body: bytes, interval_s: float, pieces: int = 8) -> None:
    """Write `body` in `pieces` parts with `interval_s` between them."""
    size = max(1, -(-len(body) // pieces))
    for start in range(0, len(body), size):
        if start:
            await asyncio.sleep(interval_s)
        await response.write(body[start:start + size])
