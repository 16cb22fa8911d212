"""The Responses and Messages backends: request bodies, whole answers and streams, sans-io.

The streams are llama-server build 11434's own (ids shortened), and each is read whole and in
every two-way split of its bytes: the outcome and the count of content events never change.
"""

from __future__ import annotations

import json

import pytest

from loadgen.client.backends import GenerationParams, make_backend
from loadgen.client.sse import StreamReader
from loadgen.core import records
from servers import refused_port

PARAMS = GenerationParams(prompt="hello", n_predict=4, stream=True, seed=7)


def ev(kind: str, **fields: object) -> bytes:
    return f"event: {kind}\ndata: ".encode() + json.dumps({"type": kind, **fields}, separators=(",", ":")).encode() \
        + b"\n\n"


TIMINGS = {"cache_n": 0, "prompt_n": 35, "prompt_ms": 437.5, "predicted_n": 4, "predicted_ms": 58.8,
           "predicted_per_second": 50.9}
USAGE = {"input_tokens": 35, "output_tokens": 4, "total_tokens": 39, "input_tokens_details": {"cached_tokens": 0}}
RESPONSES_STREAM = b"".join([
    ev("response.created", response={"id": "resp_1", "object": "response", "status": "in_progress"}),
    ev("response.in_progress", response={"id": "resp_1", "object": "response", "status": "in_progress"}),
    ev("response.output_item.added", item={"content": [], "id": "msg_1", "role": "assistant", "type": "message"}),
    ev("response.content_part.added", item_id="msg_1", part={"type": "output_text", "text": ""}),
    *[ev("response.output_text.delta", item_id="msg_1", delta=t) for t in ("(", "M", "AL", "LOC")],
    ev("response.output_text.done", item_id="msg_1", text="(MALLOC"),
    ev("response.output_item.done", item={"type": "message", "status": "completed", "content": []}),
    ev("response.completed", response={"id": "resp_1", "status": "completed", "output": [], "usage": USAGE},
       timings=TIMINGS),
])
MESSAGES_STREAM = b"".join([
    ev("message_start", message={"id": "m1", "type": "message", "role": "assistant", "content": [],
                                 "stop_reason": None, "usage": {"cache_read_input_tokens": 25, "input_tokens": 11,
                                                                "output_tokens": 0}}),
    ev("content_block_start", index=0, content_block={"type": "text", "text": ""}),
    *[ev("content_block_delta", index=0, delta={"type": "text_delta", "text": t}) for t in ("A", "le", "em", ".")],
    ev("content_block_stop", index=0),
    ev("message_delta", delta={"stop_reason": "max_tokens", "stop_sequence": None}, usage={"output_tokens": 4}),
    ev("message_stop"),
])


def read(api: str, data: bytes, cut: int | None = None) -> tuple[records.ServerOutcome, StreamReader]:
    stream = StreamReader(make_backend(api, PARAMS, model="m").event_reader())
    reads = [data] if cut is None else [data[:cut], data[cut:]]
    for i, chunk in enumerate(reads):
        stream.on_chunk(chunk, 1_000_000 * (i + 1))
    return stream.finish(3_000_000), stream


def test_request_bodies_put_the_salt_first_and_turn_the_cache_off():
    resp = json.loads(make_backend("responses", PARAMS, model="m").build("abc-1"))
    assert resp == {"input": "[abc-1] hello", "model": "m", "max_output_tokens": 4, "temperature": 0.7,
                    "ignore_eos": True, "cache_prompt": False, "seed": 7, "stream": True}
    msg = json.loads(make_backend("messages", PARAMS, model=None).build("abc-2"))
    assert msg["messages"] == [{"role": "user", "content": "[abc-2] hello"}]
    assert (msg["model"], msg["max_tokens"], msg["cache_prompt"], msg["stream"]) == ("default", 4, False, True)


def test_responses_stream_reads_usage_timings_and_four_content_events():
    outcome, stream = read("responses", RESPONSES_STREAM)
    assert outcome.error_kind is None
    assert outcome.usage == records.Usage(35, 4, 39)
    assert (outcome.predicted_n, outcome.prompt_n, outcome.cache_n, outcome.finish_reason) == (4, 35, 0, "completed")
    assert stream.chunks == 4


def test_messages_stream_adds_cache_reads_to_the_prompt_and_reads_the_stop_reason():
    outcome, stream = read("messages", MESSAGES_STREAM)
    assert outcome.error_kind is None
    assert outcome.usage == records.Usage(36, 4, 40)  # 11 computed + 25 read from the cache
    assert (outcome.cache_n, outcome.finish_reason, outcome.predicted_n) == (25, "max_tokens", None)
    assert stream.chunks == 4


@pytest.mark.parametrize("api,data", [("responses", RESPONSES_STREAM), ("messages", MESSAGES_STREAM)])
def test_every_two_way_split_reads_the_same(api, data):
    whole, stream = read(api, data)
    for cut in range(len(data) + 1):
        outcome, split = read(api, data, cut)
        assert (outcome, split.chunks) == (whole, stream.chunks), cut


@pytest.mark.parametrize("api,data,final", [
    ("responses", RESPONSES_STREAM, b"event: response.completed"),
    ("messages", MESSAGES_STREAM, b"event: message_stop"),
])
def test_a_stream_without_its_final_event_is_truncated(api, data, final):
    outcome, _ = read(api, data[:data.index(final)])
    assert outcome.error_kind == records.TRUNCATED_STREAM


@pytest.mark.parametrize("api,data,error,message", [
    ("responses", RESPONSES_STREAM, ev("error", code="server_error", message="slot crashed"), "slot crashed"),
    ("responses", RESPONSES_STREAM, ev("response.failed", response={"status": "failed", "error": {
        "code": "server_error", "message": "it failed"}}), "it failed"),
    ("responses", RESPONSES_STREAM, b'data: {"error":{"code":500,"message":"llama says no","type":"server_error"}}\n\n',
     "llama says no"),
    ("messages", MESSAGES_STREAM, ev("error", error={"type": "overloaded_error", "message": "Overloaded"}),
     "Overloaded"),
    ("messages", MESSAGES_STREAM, b'data: {"error":{"code":500,"message":"llama says no","type":"server_error"}}\n\n',
     "llama says no"),
])
def test_an_error_event_mid_stream_is_a_stream_error_in_the_apis_own_shape(api, data, error, message):
    cut = data.index(b"event: ", len(data) // 2)
    outcome, _ = read(api, data[:cut] + error + data[cut:])
    assert (outcome.error_kind, outcome.error_message) == (records.STREAM_ERROR, message)


def test_whole_answers_and_error_bodies():
    resp = make_backend("responses", GenerationParams(prompt="p"), model="m")
    body = json.dumps({"id": "r", "status": "completed", "output": [{"type": "message"}], "usage": USAGE}).encode()
    outcome = resp.parse(200, body)
    assert (outcome.error_kind, outcome.usage, outcome.cache_n) == (None, records.Usage(35, 4, 39), 0)
    err = resp.parse(400, b'{"error":{"code":400,"message":"\'input\' is required","type":"invalid_request_error"}}')
    assert (err.error_kind, err.error_message) == ("http_400", "'input' is required")

    msg = make_backend("messages", GenerationParams(prompt="p"), model="m")
    body = json.dumps({"type": "message", "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
                       "usage": {"cache_read_input_tokens": 24, "input_tokens": 15, "output_tokens": 2}}).encode()
    outcome = msg.parse(200, body)
    assert (outcome.usage, outcome.cache_n, outcome.finish_reason) == (records.Usage(39, 2, 41), 24, "end_turn")
    anthropic = msg.parse(529, b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}')
    assert (anthropic.error_kind, anthropic.error_message) == ("http_529", "Overloaded")
    assert msg.parse(200, b'{"type":"message"}').error_kind == records.INVALID_JSON


def test_reasoning_effort_goes_where_each_api_expects_it():
    params = GenerationParams(prompt="p", reasoning_effort="high")
    chat = json.loads(make_backend("chat", params, model="m").build("s"))
    resp = json.loads(make_backend("responses", params, model="m").build("s"))
    assert chat["reasoning_effort"] == "high" and "reasoning" not in chat
    assert resp["reasoning"] == {"effort": "high"} and "reasoning_effort" not in resp
    assert "reasoning_effort" not in json.loads(make_backend("chat", GenerationParams(prompt="p"), model="m").build("s"))


@pytest.mark.parametrize("api,refused", [("chat", False), ("responses", False), ("messages", True),
                                         ("llamacpp", True), ("completions", True)])
def test_reasoning_effort_is_refused_in_one_sentence_where_the_api_has_no_field(api, refused, loadgen, tmp_path):
    out = tmp_path / "run"
    with refused_port() as port:  # nothing listens: an accepted flag gets as far as the connection
        code, _, err = loadgen("sweep", "--url", f"http://127.0.0.1:{port}", "--api", api, "--reasoning-effort",
                               "low", "--wait-ready", "0", "--concurrency", "1", "--requests", "1", "--output",
                               str(out))
    assert "Traceback" not in err
    if refused:
        assert code == 2 and "--reasoning-effort applies to --api chat or responses" in err
    else:
        assert "--reasoning-effort" not in err


def test_paramcheck_canaries_speak_each_apis_own_words():
    from loadgen.client.canary import ENDPOINTS, applicable, canary_body

    asked = {"max_tokens": 7, "temperature": 0.55, "reasoning_effort": "high", "logprobs": 2}
    resp = canary_body("responses", asked, "hi", "m")
    assert (ENDPOINTS["responses"], resp["input"], resp["max_output_tokens"], resp["reasoning"]) == \
        ("/v1/responses", "hi", 7, {"effort": "high"})
    assert "max_tokens" not in resp and "logprobs" not in resp
    msg = canary_body("messages", asked, "hi", "m")
    assert (ENDPOINTS["messages"], msg["messages"], msg["max_tokens"]) == \
        ("/v1/messages", [{"role": "user", "content": "hi"}], 7)
    assert "reasoning_effort" not in msg and "logprobs" not in msg
    assert [applicable(api, "reasoning_effort") for api in ("chat", "responses", "messages", "llamacpp")] == \
        [True, True, False, False]
    assert applicable("completions", "logprobs") and not applicable("responses", "logprobs")
