"""The sans-io HTTP/1.x response parser: bytes and their arrival times in, a response out.

`ResponseParser` never touches a socket. It is fed each read with the time it arrived and says when
a response is complete (Content-Length, chunked, read-until-close, interim 1xx skipped); a read's
de-chunked body bytes go to `on_chunk` in one call, so no whole body is buffered when streaming.
httptools (the parser uvicorn uses) does the parsing; header fields are decoded only when asked.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

from .transport import ChunkCallback


class BadResponse(Exception):
    """Bytes that are not a valid HTTP/1.x response."""


class ResponseParser:
    """One connection's incremental response parsing: feed it reads, it says when a response is done.

    After `start(on_chunk)`, `feed(data, t_ns)` any split of a response's bytes; `complete` turns
    True on the read that ends it. Body bytes go to `on_chunk(bytes, t_ns)` once per read (de-chunked)
    or, without `on_chunk`, are kept for `body()`. Interim 1xx responses are skipped.

    Header fields are not handed to Python one by one (loadgen reads none of them on the hot path):
    the reads up to the end of the head are kept, and `headers()` parses them when asked.
    """

    __slots__ = ("_parser", "_on_chunk", "_pieces", "_head_reads", "_t_ns", "status", "headers_ns", "body_ns",
                 "complete", "complete_ns", "keep_alive", "extra_data")

    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self.start(None)

    def start(self, on_chunk: ChunkCallback | None) -> None:
        self._on_chunk = on_chunk
        self._pieces: list[bytes] = []
        self._head_reads: list[bytes] = []
        self._t_ns = 0
        self.status = 0  # 0 until the final (non-1xx) status line and headers are in
        self.headers_ns = 0
        self.body_ns = 0  # when the first byte of the body came (0: none yet); the stall clock's start
        self.complete = False
        self.complete_ns = 0
        self.keep_alive = False
        self.extra_data = False  # bytes after the response: the connection cannot be reused

    def feed(self, data: bytes, t_ns: int) -> None:
        """Parse one read. Raises BadResponse; exceptions from `on_chunk` propagate."""
        self._t_ns = t_ns
        if not self.status:
            self._head_reads.append(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if not self.complete:
                raise BadResponse("the server switched protocols (HTTP upgrade)") from None
            self.extra_data = True
        except httptools.HttpParserError as exc:
            if not self.complete:
                raise BadResponse(f"invalid HTTP response ({_first_line(exc)})") from None
            self.extra_data = True  # e.g. bytes after a `Connection: close` response
        if self._on_chunk is not None and self._pieces:
            pieces, self._pieces = self._pieces, []
            self._on_chunk(pieces[0] if len(pieces) == 1 else b"".join(pieces), t_ns)

    def feed_eof(self, t_ns: int) -> bool:
        """The server closed its side. True when that ended a response delimited by the close."""
        if self.complete or not self.status or self._has_length():
            return False
        self.complete, self.complete_ns, self.keep_alive = True, t_ns, False
        return True

    def _has_length(self) -> bool:
        if self.status in (204, 304):
            return True
        names = {n.lower() for n, _ in head_fields(self._head_reads)}
        return b"content-length" in names or b"transfer-encoding" in names

    def body(self) -> bytes:
        p = self._pieces
        return b"" if not p else p[0] if len(p) == 1 else b"".join(p)

    def headers(self) -> ResponseHeaders:
        return ResponseHeaders(self._head_reads if self.status else [])

    # httptools callbacks (no on_header: see the class docstring) ---------------------------------

    def on_headers_complete(self) -> None:
        if self.complete:  # a second response after ours: the server is out of step
            self.extra_data = True
            return
        status = self._parser.get_status_code()
        if 100 <= status < 200:  # 100 Continue, 103 Early Hints: a final response follows
            return
        self.status, self.headers_ns = status, self._t_ns

    def on_body(self, body: bytes) -> None:
        if not self.complete:
            self._pieces.append(body)

    def on_message_complete(self) -> None:
        if self.status and not self.complete:
            self.complete, self.complete_ns = True, self._t_ns
            self.keep_alive = self._parser.should_keep_alive()


def head_fields(reads: list[bytes]) -> list[tuple[bytes, bytes]]:
    """The header fields of the final (non-1xx) response head at the start of `reads`, which
    httptools has already found valid: interim 1xx heads before it are skipped."""
    data = b"".join(reads)
    start = len(data) - len(data.lstrip(b"\r\n"))  # empty lines before a status line are allowed
    while True:
        end = data.find(b"\r\n\r\n", start)
        if end < 0:
            return []
        lines = data[start:end].split(b"\r\n")
        status = lines[0].split(None, 2)[1:2]
        if not (status and status[0][:1] == b"1" and len(status[0]) == 3):
            break
        start = end + 4
        start += len(data) - start - len(data[start:].lstrip(b"\r\n"))
    fields = []
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        fields.append((name, value.strip(b" \t")))
    return fields


class ResponseHeaders(Mapping[str, str]):
    """A response's headers, names case-insensitive; parsed only when first read (most never are)."""

    __slots__ = ("_reads", "_decoded")

    def __init__(self, reads: list[bytes]):
        self._reads = reads
        self._decoded: CIMultiDictProxy[str] | None = None

    def _headers(self) -> CIMultiDictProxy[str]:
        if self._decoded is None:
            self._decoded = CIMultiDictProxy(CIMultiDict(
                (n.decode("latin-1"), v.decode("latin-1")) for n, v in head_fields(self._reads)))
        return self._decoded

    def __getitem__(self, name: str) -> str:
        return self._headers()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._headers())

    def __len__(self) -> int:
        return len(self._headers())

    def items(self):  # every (name, value), repeated names included, in the order received
        return self._headers().items()

    def getall(self, name: str) -> list[str]:
        return self._headers().getall(name)

    def __repr__(self) -> str:
        return f"ResponseHeaders({dict(self._headers().items())!r})"


def _first_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:300]


class BodyTimedParser(ResponseParser):
    """A ResponseParser that also notes when its body's first byte came (`body_ns`), for
    --stall-timeout (connections.py): a separate class so that a run without it pays nothing per read."""

    __slots__ = ()

    def on_body(self, body: bytes) -> None:
        if not self.complete:
            self._pieces.append(body)
            if not self.body_ns:
                self.body_ns = self._t_ns
