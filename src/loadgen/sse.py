"""Server-sent events, read incrementally as bytes arrive.

`SSESplitter` turns network reads into event payloads (the `data:` field of each event), whatever
the reads' boundaries: a line split across reads, `\\r\\n` or `\\n` endings, several events in one
read. Comment lines (`: ping`) and fields other than `data` are skipped.

`StreamReader` is the glue a streaming request needs: it feeds reads to the splitter, hands each
payload to the backend's per-request `EventReader`, and stamps the content events with the arrival
time of the read that carried them (taken by the transport once per read, before any parsing).
It knows no API: which events carry content and what ends a stream is the backend's to say.
"""

from __future__ import annotations

from array import array
from typing import Protocol

from .records import STREAM_ERROR, ServerOutcome

# Bytes of a non-SSE body kept for the error message when a "stream" turns out to be something else
# (a JSON error with its HTTP status, an HTML page from a proxy). Past this nothing more is kept.
RAW_PREFIX_LIMIT = 64 * 1024
# A single SSE line longer than this is not an event stream we can trust; stop buffering it.
MAX_LINE = 16 * 1024 * 1024


class SSESplitter:
    """Incremental SSE parser: `feed(read)` returns the payloads of the events the read completed."""

    __slots__ = ("_tail", "_data", "overflow")

    def __init__(self) -> None:
        self._tail = b""  # an incomplete line carried over to the next read
        self._data: list[bytes] = []  # data lines of the event being assembled
        self.overflow = False

    def feed(self, chunk: bytes) -> list[bytes]:
        if self._tail:
            chunk = self._tail + chunk
        lines = chunk.split(b"\n")
        self._tail = lines.pop()
        if len(self._tail) > MAX_LINE:
            self.overflow = True
            self._tail = b""
        events: list[bytes] = []
        data = self._data
        for line in lines:
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:  # blank line: the event is complete
                if data:
                    events.append(data[0] if len(data) == 1 else b"\n".join(data))
                    data.clear()
            elif line.startswith(b"data:"):
                data.append(line[6:] if line.startswith(b"data: ") else line[5:])
            # comments (":...") and other fields (event:, id:, retry:) carry nothing we record
        return events

    def close(self) -> list[bytes]:
        """End of stream: an event not followed by a blank line still counts (servers do that)."""
        events = self.feed(b"\n\n") if self._tail else []
        if self._data:
            events.append(b"\n".join(self._data))
            self._data.clear()
        return events


class EventReader(Protocol):
    """A backend's reader of one streamed response, event by event."""

    def event(self, data: bytes) -> bool:
        """Read one event's payload; True when it carried generated content (a token chunk)."""
        ...

    def finish(self) -> ServerOutcome:
        """The stream ended: the outcome, with `truncated_stream` if its final event never came."""
        ...


class StreamReader:
    """One streaming request: payloads to the backend, content events stamped with arrival times."""

    __slots__ = ("_splitter", "_reader", "_raw", "events", "chunks", "first_ns", "last_ns", "gaps_us",
                 "failed")

    def __init__(self, reader: EventReader):
        self._splitter = SSESplitter()
        self._reader = reader
        self._raw = bytearray()
        self.events = 0
        self.chunks = 0  # content events
        self.first_ns: int | None = None
        self.last_ns: int | None = None
        self.gaps_us = array("q")  # between successive content events, in microseconds
        self.failed: ServerOutcome | None = None  # the first event the backend could not read

    def on_chunk(self, chunk: bytes, t_ns: int) -> None:
        if self.events == 0 and len(self._raw) < RAW_PREFIX_LIMIT:
            self._raw += chunk[:RAW_PREFIX_LIMIT - len(self._raw)]
        self._take(self._splitter.feed(chunk), t_ns)

    def _take(self, payloads: list[bytes], t_ns: int) -> None:
        event = self._reader.event
        for payload in payloads:
            self.events += 1
            try:
                content = event(payload)
            except Exception as exc:  # noqa: BLE001 - a backend bug must not lose the record
                if self.failed is None:
                    self.failed = ServerOutcome(error_kind=STREAM_ERROR,
                                                error_message=f"unreadable event: {exc}"[:300])
                continue
            if content:
                self.chunks += 1
                if self.last_ns is None:
                    self.first_ns = t_ns
                else:
                    self.gaps_us.append((t_ns - self.last_ns) // 1000)
                self.last_ns = t_ns

    def finish(self, t_ns: int) -> ServerOutcome:
        self._take(self._splitter.close(), t_ns)
        if self.failed is not None:
            return self.failed
        return self._reader.finish()

    @property
    def raw_prefix(self) -> bytes:
        """The first bytes of the body while no event had been seen (for non-SSE error bodies)."""
        return bytes(self._raw)
