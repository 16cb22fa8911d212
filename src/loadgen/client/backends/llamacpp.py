"""llama.cpp's native `POST /completion`, whole or streamed.

Streamed, every event is a JSON object; the last one has `stop: true` and `timings`, and then the
server closes the stream without a `[DONE]` line.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ...core import records
from ...core.records import ServerOutcome
from . import GenerationParams, SaltedBodies, generation_fields
from .common import Timings, decode_event, error_outcome, served_outcome, truncated, undecodable
from .conversation import History, turn_prompt
from .features import answer_check, checked_parse, checked_reader, feature_fields


class _Completion(msgspec.Struct):
    """The part of a /completion response, stream event or error body that loadgen reads."""

    content: str | None = None
    stop: bool | None = None
    timings: Timings | None = None
    tokens_predicted: int | None = None
    stop_type: str | None = None
    id_slot: int | None = None
    error: Any = None


_decode = msgspec.json.Decoder(_Completion).decode


def _outcome(data: _Completion) -> ServerOutcome:
    return served_outcome(data.timings, data.tokens_predicted, data.stop_type, None, data.id_slot)


class LlamaCppBackend:
    name = "llamacpp"
    method = "POST"
    path = "/completion"

    def __init__(self, params: GenerationParams):
        self.params = params
        self.stream = params.stream
        fields = self._fields = generation_fields(params, "n_predict")
        fields.update(feature_fields(params, self.name))
        self._bodies = SaltedBodies(b'{"prompt":', params.prompt_list, b"", fields, params.n_predicts, "n_predict",
                                    params.prefixes)
        self.build = self._bodies.build
        check = answer_check(params)
        if check is not None:  # judged answers; a plain run keeps the methods below as they are
            self.parse = checked_parse(self.parse, check, False)  # type: ignore[method-assign]  # checked answers only
            self.event_reader = lambda: checked_reader(_StreamEvents, check, False)  # type: ignore[method-assign]  # checked answers only

    def parse(self, status: int, body: bytes) -> ServerOutcome:
        try:
            data = _decode(body)
        except msgspec.DecodeError as exc:  # not JSON, or JSON of the wrong shape
            return undecodable(status, body, exc)
        if status >= 400 or data.error is not None:
            return error_outcome(status, body, data.error)
        if data.timings is None:
            return ServerOutcome(error_kind=records.INVALID_JSON, error_message="response has no `timings` object")
        return _outcome(data)

    def event_reader(self) -> _StreamEvents:
        return _StreamEvents()

    def build_turn(self, salt: str, history: History, message: str, id_slot: int | None = None) -> bytes:
        """A conversation's turn: its history as raw text (`turn_prompt`), then the fields `build` sends."""
        return msgspec.json.encode({"prompt": turn_prompt(salt, history, message), **self._fields,
                                    **({"id_slot": id_slot} if id_slot is not None else {})})

    def answer_reader(self) -> _StreamEvents:
        return _StreamEvents(keep_text=True)


class _StreamEvents:
    """One streamed /completion: content events until the `stop: true` one."""

    __slots__ = ("final", "error", "_text")

    def __init__(self, keep_text: bool = False) -> None:
        self.final: _Completion | None = None
        self.error: ServerOutcome | None = None
        self._text: list[str] | None = [] if keep_text else None  # each event's content, kept: every event is decoded

    @property
    def answer(self) -> str:
        return "".join(self._text or ())

    def count_region(self, region: bytes) -> tuple[int, int] | None:
        """(events, content events) of a region holding only partial events, from a few byte counts
        (each done in C); None for anything else (the final event, an error, comments, an event
        that is not one `data: {...}` line), which is then read event by event. A key with its
        quotes cannot occur inside a JSON string, nor a raw newline, so generated text cannot fool
        the counts. Partial events are checked for shape, not parsed: one cut short fails the
        shape and is read (and reported) like any other."""
        if self.final is not None or self.error is not None or self._text is not None:
            return None
        # Every newline in a "}\n\n" (the events' ends) and no other: then the events are the
        # newline pairs, counted by the cheaper one-byte count (a scan less of the region).
        newlines = region.count(b"\n")
        events = newlines // 2
        if (newlines % 2 or region.count(b"}\n\n") != events or region.count(b'"stop":false') != events
                or region.count(b"data: {") != events or b'"error"' in region):
            return None
        return events, events - region.count(b'"content":""')

    def events(self, payloads: list[bytes]) -> int:
        # The many partial events are judged from their bytes, the final one (and an error) is
        # decoded. A key with its quotes cannot occur inside a JSON string (quotes in strings are
        # escaped), so generated text cannot fool these tests. llama-server writes compact JSON.
        content, fast = 0, self._text is None
        for data in payloads:
            if self.final is not None or self.error is not None:
                break  # nothing after the end counts
            if fast and b'"stop":false' in data and data.endswith(b"}") and b'"error"' not in data:
                if b'"content":""' not in data:
                    content += 1
            elif self._event(data):
                content += 1
        return content

    def _event(self, data: bytes) -> bool:
        chunk, self.error = decode_event(_decode, data)
        if chunk is None:
            return False
        if self._text is not None and chunk.content:
            self._text.append(chunk.content)
        if chunk.stop:
            self.final = chunk
            return bool(chunk.content) and chunk.timings is None
        return bool(chunk.content)

    def finish(self) -> ServerOutcome:
        if self.error is not None:
            return self.error
        if self.final is None:
            return truncated("its final `stop: true` event")
        if self.final.timings is None:
            return ServerOutcome(error_kind=records.INVALID_JSON, error_message="final event has no `timings` object")
        return _outcome(self.final)
