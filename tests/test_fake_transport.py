"""The engine and the llama.cpp backend over an in-process transport (tests/fake_transport.py): what
a level records for answers, HTTP errors, failed connections and streams, with no server at all.
Expected answers written before running."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from fake_transport import FakeAnswer, FakeRequest, MockTransport
from fixture_server import COMPLETION, completion_stream
from loadgen.client.backends import GenerationParams, make_backend
from loadgen.client.transport import TransportError
from loadgen.core import records
from loadgen.core.records import LevelRun
from loadgen.run.engine import run_level


def _level(handler, *, concurrency: int = 2, requests: int = 6, stream: bool = False) -> tuple[LevelRun, MockTransport]:
    async def main() -> tuple[LevelRun, MockTransport]:
        transport = MockTransport(handler)
        await transport.open("http://fake", concurrency, 30)
        backend = make_backend("llamacpp", GenerationParams(prompt="p", n_predict=8, stream=stream))
        level = LevelRun(target="fake", concurrency=concurrency)
        await run_level(level, transport, backend, requests=requests, duration_s=None)
        await transport.close()
        return level, transport
    return asyncio.run(main())


def test_every_request_is_one_record_with_the_servers_figures():
    level, transport = _level(lambda req: FakeAnswer.json(200, COMPLETION))
    assert sorted(r.seq for r in level.records) == list(range(6))
    assert all(r.ok and r.predicted_n == 8 and r.prompt_n == 12 for r in level.records)
    assert all(r.complete_ns >= r.send_ns for r in level.records)
    assert {(q.method, q.path) for q in transport.requests} == {("POST", "/completion")}
    assert transport.requests[0].json()["n_predict"] == 8 and transport.closed


def test_an_http_error_is_recorded_by_its_status():
    answers = itertools.cycle([FakeAnswer.json(200, COMPLETION), FakeAnswer.json(500, {"error": {"message": "boom"}})])
    level, _ = _level(lambda req: next(answers))
    kinds = sorted(r.error_kind or "ok" for r in level.records)
    assert kinds == ["http_500"] * 3 + ["ok"] * 3


def test_a_failed_connection_is_recorded_with_its_kind():
    def refuse(req: FakeRequest) -> FakeAnswer:
        raise TransportError(records.CONNECT_ERROR, "connection refused by fake (is the server running?)")
    level, _ = _level(refuse, requests=3)
    assert [r.error_kind for r in level.records] == [records.CONNECT_ERROR] * 3
    assert all("refused" in (r.error_message or "") for r in level.records)


@pytest.mark.parametrize("pieces", [1, 3])
def test_a_stream_in_pieces_gives_first_token_and_gaps(pieces):
    events = b"".join(completion_stream(8))
    size = -(-len(events) // pieces)
    chunks = tuple(events[i:i + size] for i in range(0, len(events), size))
    level, transport = _level(lambda req: FakeAnswer(200, chunks=chunks, headers={"content-type": "text/event-stream"}),
                              requests=2, stream=True)
    assert all(q.streamed for q in transport.requests)
    assert all(r.ok and r.predicted_n == 8 and r.first_token_ns is not None for r in level.records)
    assert all(r.send_ns <= r.first_token_ns <= r.complete_ns for r in level.records)
