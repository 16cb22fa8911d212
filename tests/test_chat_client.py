"""`loadgen chat` sends its turns through the one client sweep uses (issue 47): the same backend
builds each turn's request and the same transport sends it, so a stand-in server sees a chat turn
arrive with exactly the headers and fields of a sweep request to the same API (the prompt aside,
which carries the conversation), `--transport` is obeyed, and the records carry sweep's fields
(the time the headers came, each content event's gap) and the target its read clock."""

from __future__ import annotations

import http.server
import json
import threading

import pytest

from fixture_server import chat_stream, completion_stream, sse
from loadgen.client.backends import GenerationParams, make_backend
from loadgen.client.registry import transport_class
from loadgen.client.sse import StreamReader
from loadgen.results.reader import load_records
from servers import in_process_cli, serve_handler

TOKENS = 3


@pytest.fixture
def loadgen(monkeypatch, capsys):
    return in_process_cli(monkeypatch, capsys)


class StandIn:
    """A server that answers /health, streams a canned answer to every POST, and keeps each POST."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, dict[str, str], dict]] = []
        lock, posts = threading.Lock(), self.posts

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = b'{"status":"ok"}' if self.path == "/health" else b'{"error":"no"}'
                self.send_response(200 if self.path == "/health" else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    posts.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                events = chat_stream(TOKENS) if "chat" in self.path else completion_stream(TOKENS)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                for event in events:
                    self.wfile.write(event)
                    self.wfile.flush()
                self.close_connection = True

            def log_message(self, *args):
                pass

        self.handler = Handler


def sent(loadgen, url: str, stand_in: StandIn, out, *args: str) -> list[tuple[str, dict[str, str], dict]]:
    """The POSTs `loadgen ARGS` sent to the stand-in."""
    stand_in.posts.clear()
    code, _, err = loadgen(*args, "--url", url, "--output", out)
    assert code == 0, err
    return list(stand_in.posts)


@pytest.mark.parametrize("transport", ["fast", "aiohttp"])
@pytest.mark.parametrize("api,prompt_key", [("llamacpp", "prompt"), ("chat", "messages")])
def test_a_chat_turn_is_a_sweep_request_with_the_history_in_its_prompt(loadgen, tmp_path, transport, api,
                                                                        prompt_key):
    common = ("--api", api, "--n-predict", "3", "--transport", transport)
    stand_in, out = StandIn(), tmp_path / "chat"
    with serve_handler(stand_in.handler) as url:
        sweep_posts = sent(loadgen, url, stand_in, tmp_path / "sweep", "sweep", *common, "--stream",
                           "--concurrency", "1", "--requests", "1", "--warmup", "0")
        chat_posts = sent(loadgen, url, stand_in, out, "chat", *common, "--users", "1", "--turns", "2",
                          "--message-tokens", "8")
    (path, headers, body), = sweep_posts
    assert len(chat_posts) == 2
    for chat_path, chat_headers, chat_body in chat_posts:
        assert chat_path == path
        # the same headers, byte for byte but the length (a user agent, a Connection: close, ...)
        assert {k: v for k, v in chat_headers.items() if k != "content-length"} == \
               {k: v for k, v in headers.items() if k != "content-length"}
        # the same fields: only the prompt and the cache switch (chat's mode) differ
        assert chat_body.pop("cache_prompt") is True and body["cache_prompt"] is False
        assert {k: v for k, v in chat_body.items() if k != prompt_key} == \
               {k: v for k, v in body.items() if k not in (prompt_key, "cache_prompt")}
    # turn 2 re-sends turn 1's answer as it streamed
    answer = ("x" if api == "llamacpp" else "y") * TOKENS
    second = chat_posts[1][2][prompt_key]
    assert (f"\nAssistant:{answer}\n" in second if api == "llamacpp"
            else second[1] == {"role": "assistant", "content": answer})
    # sweep's records: the headers' time and each content event's gap; the target's read clock is the transport's
    records = load_records(out)
    assert len(records) == 2 and all(r.ok and r.headers_ns is not None and r.chunks == TOKENS
                                     and len(r.chunk_gaps_us or ()) == TOKENS - 1 for r in records), records
    run = json.loads((out / "run.json").read_text())
    assert run["targets"][0]["read_clock"] == transport_class(transport)().read_clock


# (first bytes of a body that brought no event, whether it is a whole body rather than a stream)
NOT_A_STREAM = [
    (b"", False),  # nothing came: a cut stream, not a body
    (b"<html><body>hello</body></html>", True),
    (b"  <!DOCTYPE html>", True),
    (b'{"error":{"message":"no"}}', True),
    (b": ping\n\n", False),
    (b"data: {\"conte", False),
    (b"event: message\n", False),
    (b"id: 7\n", False),
    (b"retry: 100\n", False),
]


@pytest.mark.parametrize("first,whole", NOT_A_STREAM)
def test_a_body_without_events_is_read_whole_only_when_it_is_no_stream(first, whole):
    """The engine reads such a body as the backend reads a whole one: an HTML page is then "not JSON",
    the one rule of a non-LLM answer, for sweep's streams and chat's turns alike."""
    stream = StreamReader(make_backend("llamacpp", GenerationParams(prompt="p", stream=True)).event_reader())
    if first:
        stream.on_chunk(first, 1)
    assert stream.not_a_stream is whole


# usage of a streamed chat answer without llama-server's timings -> (cache_n, prompt_n)
USAGE_WITHOUT_TIMINGS = [
    ({"prompt_tokens": 40, "completion_tokens": 3, "total_tokens": 43,
      "prompt_tokens_details": {"cached_tokens": 32}}, (32, 8)),
    ({"prompt_tokens": 40, "completion_tokens": 3, "total_tokens": 43,
      "prompt_tokens_details": {"cached_tokens": 0}}, (0, 40)),
    ({"prompt_tokens": 40, "completion_tokens": 3, "total_tokens": 43}, (None, None)),  # no count of the cached
    ({"prompt_tokens": 40, "completion_tokens": 3, "total_tokens": 43, "prompt_tokens_details": {}}, (None, None)),
]


@pytest.mark.parametrize("usage,expected", USAGE_WITHOUT_TIMINGS)
def test_cached_tokens_in_usage_are_cache_n_and_the_rest_prompt_n(usage, expected):
    backend = make_backend("chat", GenerationParams(prompt="p", stream=True), model="m")
    stream = StreamReader(backend.event_reader())
    stream.on_chunk(sse({"choices": [{"index": 0, "delta": {"content": "y"}}]},
                        {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
                        {"choices": [], "usage": usage}, "[DONE]"), 1)
    outcome = stream.finish(2)
    assert outcome.error_kind is None and (outcome.cache_n, outcome.prompt_n) == expected
