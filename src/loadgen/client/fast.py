"""The fast transport: plain sockets (asyncio Protocols for TLS) and httptools, tens of µs per request.

aiohttp spends 250-300 µs of CPU per request; this transport spends a fifth of that, so one client
core can keep 64 requests in flight against a fast server and measure it rather than itself.

- One HTTP/1.1 keep-alive connection per in-flight request, per target; idle ones are reused
  (last in, first out); one the server closed while idle is dropped, not used. Nothing is retried:
  a request the server read and then dropped or reset is recorded as `disconnected`, since a retry
  cannot tell that from the race with a closing keep-alive connection and would hide the fault.
  With `close_streams` (llama-server targets) streamed requests ask for `Connection: close`:
  llama-server closes the connection after every stream although it announces keep-alive, so a
  reused one would die under the next request.
- The request head (method, path, Host, headers) is serialised once per (method, path); per request
  only Content-Length and the body are written, in one `send`. The path goes under the base URL's
  path prefix, with its query (core.baseurl), when the head is made.
- Every read carries its arrival time. Plain TCP (`SocketConnection`) reads the socket itself and
  takes the kernel's receive stamp (SO_TIMESTAMPNS): the time the bytes arrived, however long a
  busy loop took to read them. TLS (`StreamConnection`, asyncio's `ssl`) stamps a read on the loop's
  clock in `data_received`, before parsing it.
- Responses are parsed incrementally by `ResponseParser` (Content-Length, chunked, read-until-close,
  1xx skipped). A read's de-chunked body bytes go to `on_chunk` in one call, so no whole body is
  buffered when streaming.
- No proxies, no HTTP/2, no HEAD: `registry.make_transport` falls back to aiohttp when the environment sets
  a proxy for the target.

The parser is http_parser.py, the two kinds of connection connections.py, the pool pool.py.
"""

from __future__ import annotations

from asyncio import CancelledError
from collections.abc import Mapping
from urllib.parse import urlsplit

from ..core.baseurl import BaseUrl
from .pool import ConnectionPool
from .transport import ChunkCallback, HttpResponse

# Bodies up to this size are copied behind the head so a request is one write (one syscall).
_ONE_WRITE_MAX = 256 * 1024


class FastTransport(ConnectionPool):
    """The `Transport` over a `ConnectionPool` to one base URL. See the module docstring."""

    def __init__(self, kernel_stamps: bool = True) -> None:
        super().__init__(kernel_stamps)
        self._heads: dict[tuple[str, str, bool], bytes] = {}
        self._base: BaseUrl | None = None

    async def open(self, base_url: str, max_connections: int, timeout_s: float,
                   headers: Mapping[str, str] | None = None, insecure: bool = False,
                   close_streams: bool = True, stall_s: float | None = None) -> None:
        self._close_streams = close_streams
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) base URL: {base_url!r}")
        self._base = BaseUrl.parse(base_url)
        self._start(parts, max_connections, timeout_s, insecure, stall_s)
        fields = {"Host": parts.netloc, "Content-Type": "application/json"}
        for name, value in (headers or {}).items():
            for existing in [k for k in fields if k.lower() == name.lower()]:
                del fields[existing]
            fields[name] = value
        self._header_lines = "".join(f"{k}: {v}\r\n" for k, v in fields.items())

    def _head(self, method: str, path: str, close: bool) -> bytes:
        connection = "Connection: close\r\n" if close else ""
        target = self._base.target(path) if self._base is not None else path
        head = f"{method} {target} HTTP/1.1\r\n{self._header_lines}{connection}Content-Length: ".encode("latin-1")
        self._heads[(method, path, close)] = head
        return head

    async def request(self, method: str, path: str, body: bytes,
                      on_chunk: ChunkCallback | None = None) -> HttpResponse:
        if method == "HEAD":
            raise ValueError("the fast transport does not send HEAD requests; use the aiohttp transport")
        close = on_chunk is not None and self._close_streams
        head = self._heads.get((method, path, close)) or self._head(method, path, close)
        head += b"%d\r\n\r\n" % len(body)
        if len(body) <= _ONE_WRITE_MAX:
            data, rest = head + body, None
        else:
            data, rest = head, body
        deadline = self._loop.time() + self._timeout_s
        idle = self._idle
        conn = idle.pop() if idle else None
        if conn is None or not conn.open:  # the fast path above skips a coroutine per request
            conn = await self._acquire(deadline)
        waiter = conn.send(data, rest, on_chunk, deadline, close)
        try:
            return await waiter
        except CancelledError:
            conn.abandon()
            raise
