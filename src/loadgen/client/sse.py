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
from typing import Protocol, cast

from ..core.records import STREAM_ERROR, ServerOutcome

# Bytes of a non-SSE body kept for the error message when a "stream" turns out to be something else
# (a JSON error with its HTTP status, an HTML page from a proxy). Past this nothing more is kept.
RAW_PREFIX_LIMIT = 64 * 1024
# A single SSE event longer than this is not an event stream we can trust: it is dropped, and the
# request ends as a `stream_error` saying so.
MAX_LINE = 16 * 1024 * 1024


# How an event stream's first line begins: a field (data, event, id, retry) or a comment.
_SSE_STARTS = (b"data", b"event", b"id", b"retry", b":")


class SSESplitter:
    """Incremental SSE parser: `feed(read)` returns the payloads of the events the read completed.

    Works a block (one event: the lines up to a blank line) at a time: the usual single-line
    `data: ...` block costs one slice, and only other blocks are parsed line by line.
    """

    __slots__ = ("_tail", "overflow")

    def __init__(self) -> None:
        self._tail = b""  # an incomplete event carried over to the next read
        self.overflow = False  # an event grew past MAX_LINE and was dropped (StreamReader reports it)

    def feed(self, chunk: bytes) -> list[bytes]:
        return self.payloads(self.complete(chunk))

    def complete(self, chunk: bytes) -> bytes:
        """Take a read; return the complete event blocks it finished, as one bytes object ending
        in a blank line (b"" when none), with CRLF line ends made LF. The rest waits for more."""
        buf = self._tail + chunk if self._tail else chunk
        if b"\r" in buf:
            # CRLF line ends; a CR at the very end waits for its LF in the next read.
            keep_cr = buf.endswith(b"\r")
            buf = buf.replace(b"\r\n", b"\n")
            if keep_cr:
                buf, cr = buf[:-1], b"\r"
            else:
                cr = b""
        else:
            cr = b""
        end = buf.rfind(b"\n\n")
        tail = (buf[end + 2:] if end >= 0 else buf) + cr
        if len(tail) > MAX_LINE:
            self.overflow = True
            tail = b""
        self._tail = tail
        return buf[:end + 2] if end >= 0 else b""

    @staticmethod
    def payloads(region: bytes) -> list[bytes]:
        """The data of each event block of a `complete` region, in order."""
        if not region:
            return []
        blocks = region.split(b"\n\n")
        blocks.pop()  # the region ends with a blank line: nothing after it
        events: list[bytes] = []
        for block in blocks:
            if block.startswith(b"data: ") and b"\n" not in block:
                events.append(block[6:])
            elif block:
                payload = _block_payload(block)
                if payload is not None:
                    events.append(payload)
        return events

    def close(self) -> list[bytes]:
        """End of stream: an event not followed by a blank line still counts (servers do that)."""
        tail, self._tail = self._tail, b""
        payload = _block_payload(tail.replace(b"\r\n", b"\n").rstrip(b"\r\n")) if tail else None
        return [] if payload is None else [payload]


def _block_payload(block: bytes) -> bytes | None:
    """The data of one event block, its `data:` lines joined by newlines; None when it has none.

    Comment lines (":...") and other fields (event:, id:, retry:) carry nothing loadgen records.
    """
    data = [line[6:] if line.startswith(b"data: ") else line[5:]
            for line in block.split(b"\n") if line.startswith(b"data:")]
    if not data:
        return None
    return data[0] if len(data) == 1 else b"\n".join(data)


class EventReader(Protocol):
    """A backend's reader of one streamed response, event by event."""

    def events(self, payloads: list[bytes]) -> int:
        """Read the payloads of the events one network read completed, in order; return how many
        carried generated content (token chunks). One call per read, not per event: at hundreds of
        thousands of events per second a Python call per event shows."""
        ...

    def finish(self) -> ServerOutcome:
        """The stream ended: the outcome, with `truncated_stream` if its final event never came."""
        ...


class AnswerCountingReader(EventReader, Protocol):
    """A reader that tells answer events from reasoning ones (chat, responses, messages): how many
    of each it has read so far."""

    answer_events: int
    reasoning_events: int


class StreamReader:
    """One streaming request: payloads to the backend, content events stamped with arrival times."""

    __slots__ = ("_splitter", "_reader", "_count", "_raw", "events", "chunks", "first_ns", "last_ns", "gaps_us",
                 "failed", "_answers", "_first_answer_ns")

    def __init__(self, reader: EventReader):
        self._splitter = SSESplitter()
        self._reader = reader
        # A backend may count a whole region of plain events at once; None from it: event by event.
        self._count = getattr(reader, "count_region", None)
        self._raw = bytearray()
        self.events = 0
        self.chunks = 0  # content events
        self.first_ns: int | None = None
        self.last_ns: int | None = None
        self.gaps_us = array("q")  # between successive content events, in microseconds (8-byte ints)
        self.failed: ServerOutcome | None = None  # the first event the backend could not read
        # A reader that tells answer events from reasoning ones counts them in `answer_events`
        # (and `reasoning_events`): the first read that brought an answer event is stamped.
        self._answers = cast(AnswerCountingReader, reader) if hasattr(reader, "answer_events") else None
        self._first_answer_ns: int | None = None

    def on_chunk(self, chunk: bytes, t_ns: int) -> None:
        if self.events == 0 and len(self._raw) < RAW_PREFIX_LIMIT:
            self._raw += chunk[:RAW_PREFIX_LIMIT - len(self._raw)]
        splitter = self._splitter
        region = splitter.complete(chunk)
        if splitter.overflow and self.failed is None:  # an event was dropped: say so, never lose it silently
            self.failed = ServerOutcome(error_kind=STREAM_ERROR,
                                        error_message=f"an event longer than {MAX_LINE} bytes was dropped")
        if not region:
            return
        if self._count is not None:
            counted = self._count(region)
            if counted is not None:
                self._timed(counted[0], counted[1], t_ns)
                return
            # Often all but the last event are plain (the last one ends the stream): count those,
            # read the last one by itself.
            cut = region.rfind(b"\n\n", 0, len(region) - 2) + 2
            counted = self._count(region[:cut]) if cut > 2 else None
            if counted is not None:
                self._timed(counted[0], counted[1], t_ns)
                self._take(self._splitter.payloads(region[cut:]), t_ns)
                return
        self._take(self._splitter.payloads(region), t_ns)

    def _take(self, payloads: list[bytes], t_ns: int) -> None:
        try:
            content = self._reader.events(payloads)
        except Exception as exc:  # noqa: BLE001 - a backend bug must not lose the record
            content = 0
            if self.failed is None:
                self.failed = ServerOutcome(error_kind=STREAM_ERROR, error_message=f"unreadable event: {exc}"[:300])
        self._timed(len(payloads), content, t_ns)
        if content and self._answers is not None and self._first_answer_ns is None and self._answers.answer_events:
            self._first_answer_ns = t_ns

    @property
    def first_answer_ns(self) -> int | None:
        """When the first answer event arrived, if reasoning events came first or beside it; None
        without reasoning (the first answer is then `first_ns`) or without any answer."""
        if self._answers is None or not self._answers.reasoning_events:
            return None
        return self._first_answer_ns

    def _timed(self, events: int, content: int, t_ns: int) -> None:
        # Every event of one read arrived at the same time: the first content event of the read is
        # a gap after the previous read's last one, the others follow it with a gap of 0.
        self.events += events
        if content:
            last_ns = self.last_ns
            if last_ns is None:
                self.first_ns = last_ns = t_ns
            elif t_ns < last_ns:
                # A read stamped before the previous one: a kernel receive stamp moved onto the
                # monotonic clock can come out ~100 µs before a stamp taken from the clock itself
                # (the two are read in different orders). Time never runs backwards between two
                # arrivals, so this gap is 0 and the later stamp stays the last one: ITL is never
                # negative and the gaps still add up to last - first.
                self.gaps_us.append(0)
            else:
                self.gaps_us.append((t_ns - last_ns) // 1000)
                last_ns = t_ns
            if content > 1:
                self.gaps_us.frombytes(bytes(8 * (content - 1)))
            self.chunks += content
            self.last_ns = last_ns

    def finish(self, t_ns: int) -> ServerOutcome:
        self._take(self._splitter.close(), t_ns)
        if self.failed is not None:
            return self.failed
        return self._reader.finish()

    @property
    def not_a_stream(self) -> bool:
        """No event came and the body does not begin as an event stream does (a field or a comment):
        a whole body instead (JSON from a server that ignored `stream`, an HTML page)."""
        if self.events or not self._raw:
            return False
        first = bytes(self._raw[:16]).lstrip()
        return not first.startswith(_SSE_STARTS)

    @property
    def raw_prefix(self) -> bytes:
        """The first bytes of the body while no event had been seen (for non-SSE error bodies)."""
        return bytes(self._raw)
