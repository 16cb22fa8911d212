"""Nothing in flight is lost when an open loop is stopped (issue 46, item 4): every request sent is
recorded (ok, failed or cancelled), the rest of the schedule is counted as not sent, and the counts
reconcile. In-process over tests/fake_transport.py; tests/test_signals.py sends the real signals."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import numpy as np

from fake_transport import FakeAnswer, FakeRequest, MockTransport
from fixture_server import COMPLETION
from loadgen.client.backends import GenerationParams, make_backend
from loadgen.core.records import LevelRun
from loadgen.core.recordsink import RecordSink
from loadgen.results.reader import load_records
from loadgen.results.writer import _level_summaries
from loadgen.run.engine import run_open_level
from loadgen.run.recording import stream_level

SCHEDULED = 40
ANSWERED = 3  # the first three answer at once; every later one hangs until cancelled


def _stopped_level(tmp_path: Path, max_in_flight: int | None) -> LevelRun:
    """A level of 40 requests 1 ms apart whose 4th and later never answer, streamed to a records
    file as a run's are, cancelled (as a Ctrl-C cancels it) once 5 hang."""
    async def main() -> LevelRun:
        hanging = asyncio.Event()
        waiting = 0

        async def answer(req: FakeRequest) -> FakeAnswer:
            nonlocal waiting
            if len(transport.requests) <= ANSWERED:
                return FakeAnswer.json(200, COMPLETION)
            waiting += 1
            if waiting == 5:
                hanging.set()
            await asyncio.Event().wait()
            raise AssertionError("never answers")

        transport = MockTransport(answer)
        await transport.open("http://fake", 8, 30)
        backend = make_backend("llamacpp", GenerationParams(prompt="p", n_predict=8))
        sink = RecordSink(tmp_path / "requests.jsonl")
        level = stream_level(LevelRun(target="fake", concurrency=max_in_flight or 0, rate=1000.0), sink)
        offsets = np.arange(SCHEDULED, dtype=np.int64) * 1_000_000
        task = asyncio.ensure_future(run_open_level(level, transport, backend, offsets, max_in_flight=max_in_flight))
        await hanging.wait()
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        sink.close()
        await transport.close()
        return level
    return asyncio.run(main())


def test_a_stopped_open_loop_records_every_sent_request_and_counts_the_unsent(tmp_path):
    for cap in (None, 5):
        out = tmp_path / str(cap)
        out.mkdir()
        level = _stopped_level(out, cap)
        records = load_records(out)
        kinds = Counter(r.error_kind for r in records)
        # five or more hang when it is stopped (one more may leave before the cancel lands)
        assert set(kinds) == {None, "cancelled"} and kinds[None] == ANSWERED, kinds
        assert kinds["cancelled"] >= 5, kinds  # before the fix: 0, each one lost
        assert sorted(r.seq for r in records) == list(range(len(records)))
        summary = _level_summaries([level])[0]
        assert summary["requests_scheduled"] == SCHEDULED
        assert summary["requests_cancelled"] == kinds["cancelled"]
        assert summary["requests_not_sent"] == SCHEDULED - len(records)
        assert summary["requests_ok"] + summary["requests_failed"] + summary["requests_cancelled"] \
            + summary["requests_not_sent"] == SCHEDULED
        assert summary["requests_failed"] == 0 and summary["stopped_reason"] == "interrupted"
