"""Properties of the SSE parser and the stream readers, checked with hypothesis.

- Any split of a valid event stream into network reads gives the same events as the whole stream.
- Any bytes, in any reads, through any API's stream reader: never an exception; at worst the
  request is recorded with an error kind (`stream_error`, `truncated_stream`).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fixture_server import chat_stream, completion_stream
from loadgen.client.backends import GenerationParams, make_backend
from loadgen.client.sse import SSESplitter, StreamReader
from loadgen.core import records

API_NAMES = ("llamacpp", "completions", "chat")
PARAMS = GenerationParams(prompt="hello", n_predict=8, stream=True)
PROPERTY = settings(max_examples=200, deadline=None, derandomize=True)

# A payload line: any bytes but the line breaks. An event: one or more lines (joined by "\n").
line_bytes = st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"").replace(b"\r", b""))
payloads = st.lists(line_bytes, min_size=1, max_size=3).map(lambda lines: b"\n".join(lines))


@st.composite
def event_streams(draw) -> tuple[bytes, list[bytes]]:
    """(wire bytes, the payloads they carry): data lines with LF or CRLF endings, and comments,
    other fields and extra blank lines between events, as servers and proxies send them."""
    events = draw(st.lists(payloads, max_size=8))
    wire = b""
    for payload in events:
        eol = draw(st.sampled_from([b"\n", b"\r\n"]))
        for noise in draw(st.lists(st.sampled_from([b": ping", b"event: message", b"id: 7", b"retry: 100", b""]),
                                   max_size=2)):
            wire += noise + eol
        for line in payload.split(b"\n"):
            # "data:" without its space only when the value does not start with one (the spec strips one)
            tight = draw(st.booleans()) and not line.startswith(b" ")
            wire += (b"data:" if tight else b"data: ") + line + eol
        wire += eol
    return wire, events


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)])]


def parse(reads: list[bytes]) -> list[bytes]:
    splitter = SSESplitter()
    out: list[bytes] = []
    for chunk in reads:
        out += splitter.feed(chunk)
    return out + splitter.close()


@PROPERTY
@given(stream=event_streams(), cuts=st.lists(st.integers(0, 2000), max_size=12))
def test_any_split_into_reads_parses_to_the_same_events(stream, cuts):
    wire, events = stream
    assert parse([wire]) == events
    assert parse(split_at(wire, cuts)) == events


@PROPERTY
@given(stream=event_streams())
def test_one_byte_reads_parse_to_the_same_events(stream):
    wire, events = stream
    assert parse([wire[i:i + 1] for i in range(len(wire))]) == events


def read(api: str, reads: list[bytes]) -> tuple[records.ServerOutcome, StreamReader]:
    backend = make_backend(api, PARAMS, model=None if api == "llamacpp" else "m")
    stream = StreamReader(backend.event_reader())
    for i, chunk in enumerate(reads):
        stream.on_chunk(chunk, 1_000_000 * (i + 1))
    return stream.finish(1_000_000 * (len(reads) + 1)), stream


ERROR_KINDS = {records.STREAM_ERROR, records.TRUNCATED_STREAM, records.SERVER_ERROR, records.INVALID_JSON}


@PROPERTY
@given(api=st.sampled_from(API_NAMES), noise=st.binary(max_size=600), cuts=st.lists(st.integers(0, 600), max_size=8))
def test_random_bytes_never_raise_and_end_as_a_recorded_error(api, noise, cuts):
    outcome, stream = read(api, split_at(noise, cuts))
    assert isinstance(outcome, records.ServerOutcome)
    assert outcome.error_kind in ERROR_KINDS  # noise is never a complete answer
    assert outcome.error_message


json_noise = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["content", "stop", "tokens_predicted", "timings", "choices", "delta", "usage", "error",
                         "finish_reason", "text", "predicted_n", "index"]) | st.text(max_size=4),
        inner, max_size=4),
    max_leaves=10)


@PROPERTY
@given(api=st.sampled_from(API_NAMES), junk=st.lists(json_noise, min_size=1, max_size=4),
       at=st.integers(0, 20), cuts=st.lists(st.integers(0, 3000), max_size=8))
def test_events_of_the_wrong_shape_in_a_valid_stream_never_raise(api, junk, at, cuts):
    """JSON that is valid but not what the API sends, spliced into a real stream."""
    events = completion_stream(4) if api == "llamacpp" else chat_stream(4)
    if api == "completions":
        events = [e.replace(b'"delta": {"content": "y"}', b'"text": "y"') for e in events]
    at = at % (len(events) + 1)
    spliced = events[:at] + [b"data: " + json.dumps(j, allow_nan=True).encode() + b"\n\n" for j in junk] + events[at:]
    outcome, stream = read(api, split_at(b"".join(spliced), cuts))
    assert isinstance(outcome, records.ServerOutcome)
    assert outcome.error_kind is None or outcome.error_kind in ERROR_KINDS
    assert outcome.error_kind is None or outcome.error_message


@PROPERTY
@given(api=st.sampled_from(API_NAMES), steps_us=st.lists(st.integers(-300, 5_000), min_size=8, max_size=8))
def test_chunk_gaps_are_never_negative_and_add_up_to_last_minus_first(api, steps_us):
    # A kernel receive stamp moved onto the monotonic clock can come out a little before the stamp
    # of the read before it (−113 µs was seen): the gap is 0, never negative.
    events = completion_stream(8) if api == "llamacpp" else chat_stream(8)
    backend = make_backend(api, PARAMS, model=None if api == "llamacpp" else "m")
    stream = StreamReader(backend.event_reader())
    t_ns, stamps = 10_000_000, []
    for i, event in enumerate(events):
        if i < len(steps_us):
            t_ns += steps_us[i] * 1000
        stream.on_chunk(event, t_ns)
        stamps.append(t_ns)
    outcome = stream.finish(t_ns + 1_000_000)
    assert outcome.error_kind is None
    gaps = stream.gaps_us.tolist()
    assert gaps and min(gaps) >= 0
    assert stream.last_ns >= stream.first_ns
    assert sum(gaps) <= (stream.last_ns - stream.first_ns) // 1000 <= sum(gaps) + len(gaps)


def test_a_read_stamped_before_the_previous_one_is_a_gap_of_zero():
    backend = make_backend("llamacpp", PARAMS)
    stream = StreamReader(backend.event_reader())
    events = completion_stream(4)  # four content events, then the final one
    for event, t_us in zip(events, [1_000, 2_000, 1_887, 3_000, 3_500]):  # the third read 113 µs "early"
        stream.on_chunk(event, t_us * 1000)
    assert stream.finish(4_000_000).error_kind is None
    assert stream.gaps_us.tolist() == [1_000, 0, 1_000]
    assert (stream.first_ns, stream.last_ns) == (1_000_000, 3_000_000)


@pytest.mark.parametrize("api", ["completions", "chat"])
@pytest.mark.parametrize("wire", [b"data: [DONE]\n\n", b"data:[DONE]"])
def test_a_stream_of_only_done_is_no_answer(api, wire):
    # found by the property above: `[DONE]` with no chunk before it was recorded as a complete answer
    outcome, _ = read(api, [wire])
    assert outcome.error_kind == records.TRUNCATED_STREAM and "only `data: [DONE]`" in outcome.error_message


# llama-server's partial events (compact JSON, any content: quotes and newlines escaped by json.dumps),
# then its final one; in any reads.
contents = st.lists(st.text(max_size=12), min_size=1, max_size=12)


@PROPERTY
@given(texts=contents, cuts=st.lists(st.integers(0, 3000), max_size=10))
def test_counting_a_region_of_llamacpp_events_equals_reading_them_one_by_one(texts, cuts):
    events = [json.dumps({"index": 0, "content": t, "tokens": [i], "stop": False, "id_slot": 0},
                         separators=(",", ":")).encode() for i, t in enumerate(texts)]
    final = json.dumps({"content": "", "stop": True, "stop_type": "limit", "tokens_predicted": len(texts),
                        "timings": {"prompt_n": 3, "prompt_ms": 1.0, "predicted_n": len(texts), "predicted_ms": 2.0}},
                       separators=(",", ":")).encode()
    wire = b"".join(b"data: " + e + b"\n\n" for e in [*events, final])
    readers = []
    for counting in (True, False):
        backend = make_backend("llamacpp", PARAMS)
        stream = StreamReader(backend.event_reader())
        if not counting:
            stream._count = None  # every event decoded one by one
        for i, chunk in enumerate(split_at(wire, cuts)):
            stream.on_chunk(chunk, 1_000_000 * (i + 1))
        readers.append(stream)
    fast, slow = readers
    assert (fast.events, fast.chunks, list(fast.gaps_us)) == (slow.events, slow.chunks, list(slow.gaps_us))
    assert fast.chunks == sum(1 for t in texts if t)
