"""SSE parsing and the backends' stream readers: pure, no network."""

from __future__ import annotations

import pytest

from fixture_server import chat_stream, completion_stream, sse
from loadgen.client.backends import GenerationParams, make_backend
from loadgen.client.sse import SSESplitter, StreamReader
from loadgen.core import records

PARAMS = GenerationParams(prompt="hello", n_predict=8, stream=True)


def split_all(data: bytes, cuts: list[int]) -> list[bytes]:
    splitter = SSESplitter()
    out: list[bytes] = []
    last = 0
    for cut in [*cuts, len(data)]:
        out += splitter.feed(data[last:cut])
        last = cut
    return out + splitter.close()


def test_events_survive_every_two_way_split():
    data = b"".join(completion_stream(3)) + b": ping\n\n" + b'data: {"a":1}\r\n\r\n'
    whole = split_all(data, [])
    assert len(whole) == 5
    for i in range(len(data) + 1):
        assert split_all(data, [i]) == whole, i


def test_splitter_skips_comments_and_other_fields_and_joins_multiline_data():
    data = b": keep-alive\n\nevent: message\nid: 7\ndata: line one\ndata:line two\n\nretry: 10\n\n"
    assert split_all(data, []) == [b"line one\nline two"]


def test_an_event_without_its_blank_line_still_counts_at_the_end():
    assert split_all(b"data: [DONE]", []) == [b"[DONE]"]


def read_stream(api: str, reads: list[bytes], times: list[int] | None = None) -> tuple[records.ServerOutcome, StreamReader]:
    backend = make_backend(api, PARAMS, model="m" if api != "llamacpp" else None)
    stream = StreamReader(backend.event_reader())
    times = times or [1_000_000 * (i + 1) for i in range(len(reads))]
    for chunk, t in zip(reads, times):
        stream.on_chunk(chunk, t)
    return stream.finish(times[-1] if times else 0), stream


def test_completion_stream_is_complete_without_done_and_counts_the_servers_tokens():
    outcome, stream = read_stream("llamacpp", completion_stream(8))
    assert outcome.error_kind is None
    assert (outcome.predicted_n, outcome.tokens_predicted, outcome.stop_type) == (8, 8, "limit")
    assert stream.chunks == 8  # the final stop:true event carries no content
    assert stream.first_ns == 1_000_000 and stream.last_ns == 8_000_000
    assert list(stream.gaps_us) == [1000] * 7


def test_completion_stream_without_its_final_event_is_truncated():
    outcome, _ = read_stream("llamacpp", completion_stream(8)[:-1])
    assert outcome.error_kind == records.TRUNCATED_STREAM


def test_an_over_long_event_is_dropped_and_recorded_as_a_stream_error(monkeypatch):
    from loadgen.client import sse

    monkeypatch.setattr(sse, "MAX_LINE", 1024)  # the real bound is 16 MiB
    reads = completion_stream(8)
    reads.insert(3, b"data: " + b"x" * 2000)  # no blank line: the event never ends
    outcome, stream = read_stream("llamacpp", reads)
    assert outcome.error_kind == records.STREAM_ERROR
    assert "longer than 1024 bytes was dropped" in outcome.error_message
    assert stream.chunks == 8  # the events around it are still read


@pytest.mark.parametrize("api", ["llamacpp", "completions", "chat"])
def test_an_error_event_mid_stream_is_a_stream_error(api):
    head = completion_stream(3)[:2] if api == "llamacpp" else chat_stream(3)[:2]
    error = sse({"error": {"code": 500, "message": "slot crashed", "type": "server_error"}})
    outcome, _ = read_stream(api, [*head, error])
    assert outcome.error_kind == records.STREAM_ERROR
    assert outcome.error_message == "slot crashed"


@pytest.mark.parametrize("api", ["llamacpp", "chat"])
def test_noise_in_an_event_is_a_recorded_stream_error_not_an_exception(api):
    outcome, _ = read_stream(api, [b"data: {not json\n\n", b"data: \xff\xfe\n\n"])
    assert outcome.error_kind == records.STREAM_ERROR


def test_chat_stream_needs_done_and_takes_tokens_from_usage():
    outcome, stream = read_stream("chat", chat_stream(5))
    assert outcome.error_kind is None
    assert outcome.usage is not None and outcome.usage.completion_tokens == 5
    assert outcome.finish_reason == "length"
    assert stream.chunks == 5  # the role-only first delta and the usage chunk are not content
    truncated, _ = read_stream("chat", chat_stream(5)[:-1])
    assert truncated.error_kind == records.TRUNCATED_STREAM


def test_ping_comments_between_events_change_nothing():
    events = completion_stream(4)
    with_pings = [e + b": ping\n\n" for e in events]
    plain, s1 = read_stream("llamacpp", events)
    pinged, s2 = read_stream("llamacpp", with_pings)
    assert plain == pinged and s1.chunks == s2.chunks == 4


def test_several_events_in_one_read_share_its_arrival_time():
    events = completion_stream(6)
    reads = [b"".join(events[:3]), b"".join(events[3:])]  # 3 content events, then 3 + the final
    outcome, stream = read_stream("llamacpp", reads, [5_000_000, 9_000_000])
    assert outcome.predicted_n == 6
    assert stream.chunks == 6
    assert list(stream.gaps_us) == [0, 0, 4000, 0, 0]


def test_completions_stream_reads_text_choices():
    events = [sse({"choices": [{"text": "ab", "index": 0, "finish_reason": None}]}) for _ in range(3)]
    events += [sse({"choices": [{"text": "", "index": 0, "finish_reason": "length"}],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 6, "total_tokens": 9},
                    "timings": {"prompt_n": 3, "prompt_ms": 1.0, "predicted_n": 6, "predicted_ms": 5.0}}),
               sse("[DONE]")]
    outcome, stream = read_stream("completions", events)
    assert outcome.error_kind is None and stream.chunks == 3
    assert outcome.predicted_n == 6 and outcome.usage.completion_tokens == 6


def test_reasoning_deltas_count_as_content():
    events = [sse({"choices": [{"index": 0, "delta": {"reasoning_content": "hmm"}}]}),
              sse({"choices": [{"index": 0, "delta": {"content": "ok"}}]}), sse("[DONE]")]
    _, stream = read_stream("chat", events)
    assert stream.chunks == 2


@pytest.mark.parametrize("api,path,key", [("llamacpp", "/completion", b'{"prompt":"['),
                                          ("completions", "/v1/completions", b'{"prompt":"['),
                                          ("chat", "/v1/chat/completions", b'{"messages":[{"role":"user","content":"[')])
def test_bodies_put_the_salt_first_and_ask_for_no_prompt_cache(api, path, key):
    import json

    backend = make_backend(api, GenerationParams(prompt='say "hi"', n_predict=5, stream=True), model="m1")
    assert backend.path == path
    body = backend.build("0123abcd-0000-4000-8000-000000000000", 3)
    assert body.startswith(key + b"0123abcd-0000-4000-8000-000000000000] ")
    doc = json.loads(body)
    assert doc["cache_prompt"] is False and doc["stream"] is True
    if api == "llamacpp":
        assert doc["prompt"].endswith('say "hi"') and doc["n_predict"] == 5
    else:
        assert doc["model"] == "m1" and doc["max_tokens"] == 5
        assert doc["stream_options"] == {"include_usage": True}


def test_a_dataset_of_prompts_is_used_in_turn():
    import json

    backend = make_backend("llamacpp", GenerationParams(prompt="unused", prompts=("a", "b", "c")))
    texts = [json.loads(backend.build("s", i))["prompt"] for i in range(4)]
    assert texts == ["[s] a", "[s] b", "[s] c", "[s] a"]


@pytest.mark.parametrize("size", [1, 7, 64, 333, 4096])
def test_counting_a_region_of_partial_events_matches_reading_them_one_by_one(size):
    data = b"".join(completion_stream(40)[:20]) + b": ping\n\n" + b"".join(completion_stream(40)[20:])
    data = data.replace(b'"content":"x","stop":false,"tokens_predicted":7', b'"content":"","stop":false,"tokens_predicted":7')
    reads = [data[i:i + size] for i in range(0, len(data), size)]
    results = []
    for fast in (True, False):
        backend = make_backend("llamacpp", PARAMS)
        stream = StreamReader(backend.event_reader())
        if not fast:
            stream._count = None
        for i, chunk in enumerate(reads):
            stream.on_chunk(chunk, 1_000_000 * (i + 1))
        results.append((stream.finish(10**12), stream.events, stream.chunks, stream.first_ns, stream.last_ns,
                        list(stream.gaps_us)))
    assert results[0] == results[1]
    assert results[0][0].error_kind is None and results[0][2] == 39  # one partial had no content


@pytest.mark.parametrize("split", [False, True])
def test_a_partial_event_cut_short_after_its_stop_key_is_a_stream_error(split):
    events = completion_stream(4)
    cut = events[0][:events[0].index(b'"stop":false') + len(b'"stop":false')] + b"\n\n"
    reads = [cut, *events[1:]] if split else [cut + b"".join(events[1:])]
    outcome, _ = read_stream("llamacpp", reads)
    assert outcome.error_kind == records.STREAM_ERROR
