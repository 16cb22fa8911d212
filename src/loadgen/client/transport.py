"""The HTTP client behind a small interface, so each implementation is a module of its own.

A transport opens a connection pool to one base URL, sends one request at a time per caller,
and reports the status, headers and body with arrival times on `clock.now_ns`. It knows nothing
about LLM APIs (that is a backend's job) nor about scheduling (that is the engine's).

The implementations: fast.py (the default) and aiohttp_transport.py; registry.py names them and
picks one for a target.
"""

from __future__ import annotations

import errno
import socket
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from ..core.records import CONNECT_ERROR


class TransportError(Exception):
    """A request that got no complete HTTP response. `kind` is one of the records' error kinds;
    `client_limit`: it failed on this client's own limit (open files, local ports), not the server's."""

    def __init__(self, kind: str, message: str, client_limit: bool = False):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.client_limit = client_limit


# A connect that failed on this machine's limits, not the target's: the process's or the system's
# open files, or the local ports to connect from.
_OUT_OF_FILES = (errno.EMFILE, errno.ENFILE)
_OUT_OF_PORTS = (errno.EADDRNOTAVAIL,)
CLIENT_LIMIT_ADVICE = ("cap the requests in flight (--max-in-flight) or spread them over processes "
                       "(--workers)")


def connect_error(exc: BaseException, hostport: str) -> TransportError:
    """The `TransportError` of a connect that raised `exc`: the client's own limit said as the
    client's, in one line with what to do (never "target down"), else `connect_reason`."""
    code = getattr(exc, "errno", None)
    if code in _OUT_OF_FILES:
        return TransportError(CONNECT_ERROR, f"this client ran out of open files ({exc.strerror}) connecting to "  # type: ignore[attr-defined]  # an OSError by its errno
                              f"{hostport}: raise the limit (ulimit -n), or {CLIENT_LIMIT_ADVICE}", True)
    if code in _OUT_OF_PORTS:
        return TransportError(CONNECT_ERROR, f"this client ran out of local ports ({exc.strerror}) connecting to "  # type: ignore[attr-defined]  # an OSError by its errno
                              f"{hostport}: {CLIENT_LIMIT_ADVICE}", True)
    return TransportError(CONNECT_ERROR, connect_reason(exc, hostport))


@dataclass(slots=True)
class HttpResponse:
    status: int
    headers: Mapping[str, str]  # names case-insensitive
    headers_ns: int  # status line and headers received
    complete_ns: int  # last body byte received
    body: bytes  # empty when the caller consumed the body through `on_chunk`
    # The request opened its connection: how long connecting took (TCP, and TLS when https), and
    # of that the TLS handshake (None where the transport cannot tell it apart). None on a reused
    # connection, or one `connect_ahead` opened before the level's clock started.
    connect_us: int | None = None
    tls_us: int | None = None


ChunkCallback = Callable[[bytes, int], None]


class Transport(Protocol):
    """`max_connections` 0 means no limit (open loop without an in-flight cap).

    `read_clock` says what a read's time is: "kernel" (the kernel's receive stamp) or "loop" (when
    the event loop handed the bytes over).
    """

    read_clock: str

    async def open(self, base_url: str, max_connections: int, timeout_s: float,
                   headers: Mapping[str, str] | None = None, insecure: bool = False,
                   close_streams: bool = True, stall_s: float | None = None) -> None:
        """`close_streams`: streamed requests ask for `Connection: close` (for servers that close
        the connection after a stream anyway, like llama-server; elsewhere it costs a connect).
        `stall_s`: a response that began and then sends nothing for longer fails `stalled`."""
        ...

    async def request(self, method: str, path: str, body: bytes,
                      on_chunk: ChunkCallback | None = None) -> HttpResponse: ...

    async def connect_ahead(self, connections: int) -> int:
        """Open idle keep-alive connections until `connections` are open (never past the pool's
        limit), before a level's clock starts, so its first requests do not pay for connecting.
        Returns how many are open; a connection that fails is left to the requests to report."""
        ...

    async def close(self) -> None: ...


def tls_context(insecure: bool) -> ssl.SSLContext:
    """The TLS settings of every https target: the system's CAs, or no verification at all (--insecure)."""
    context = ssl.create_default_context()
    if insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def connect_reason(exc: BaseException, hostport: str) -> str:
    """One line on why a connection could not be opened, with what to do when it is ours to say."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        detail = exc.verify_message or reason_of(exc)
        return (f"TLS certificate verification failed for {hostport} ({detail}); "
                "pass --insecure to skip certificate verification")
    if isinstance(exc, ssl.SSLError):
        advice = "; if it speaks plain HTTP, use an http:// URL" if exc.reason == "WRONG_VERSION_NUMBER" else ""
        return f"TLS handshake with {hostport} failed ({exc.reason or reason_of(exc)}){advice}"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host of {hostport} ({exc.strerror})"
    if isinstance(exc, ConnectionRefusedError):
        return f"connection refused by {hostport} (is the server running?)"
    if isinstance(exc, OSError) and exc.strerror:
        return f"cannot connect to {hostport} ({exc.strerror})"
    return f"cannot connect to {hostport} ({reason_of(exc)})"


def reason_of(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:300]
