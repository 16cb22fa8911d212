"""Engine options: a soak never gives a target up and does not hammer a server that is down."""

from __future__ import annotations

import asyncio

from loadgen.client.backends import GenerationParams, make_backend
from loadgen.client.transport import TransportError
from loadgen.core import records
from loadgen.core.records import LevelRun
from loadgen.run.engine import EngineOptions, run_level
from loadgen.run.salts import new_decimal_salt


class RefusingTransport:
    """Every request is refused, as by a server that is down."""

    async def open(self, *args, **kwargs) -> None:
        pass

    async def request(self, method, path, body, on_chunk=None):
        await asyncio.sleep(0)
        raise TransportError(records.CONNECT_ERROR, "Connection refused")

    async def close(self) -> None:
        pass


BACKEND = make_backend("llamacpp", GenerationParams(prompt="hi"))


def test_by_default_a_level_gives_up_after_three_refused_connections():
    level = LevelRun(target="t", concurrency=1)
    asyncio.run(run_level(level, RefusingTransport(), BACKEND, requests=None, duration_s=5))
    assert level.stopped_reason.startswith("target down") and len(level.records) == 3


def test_never_giving_up_keeps_the_level_going_and_pauses_each_worker():
    level = LevelRun(target="t", concurrency=2, prompt_tokens=64)
    options = EngineOptions(salt=new_decimal_salt, give_up_after=None, pause_after_connect_error_s=0.1)
    asyncio.run(run_level(level, RefusingTransport(), BACKEND, requests=None, duration_s=0.5, options=options))
    assert level.stopped_reason is None and level.finished
    # 2 workers, one attempt per 0.1 s each, for 0.5 s: about 10, not thousands
    assert 6 <= len(level.records) <= 14
    assert all(r.error_kind == records.CONNECT_ERROR for r in level.records)
    assert all(r.salt.replace("-", "").isdigit() and r.prompt_tokens_target == 64 for r in level.records)


class Http500Transport:
    """A live server that answers every request at once with HTTP 500."""

    async def open(self, *args, **kwargs) -> None:
        pass

    async def request(self, method, path, body, on_chunk=None):
        from loadgen.client.transport import HttpResponse
        from loadgen.core.clock import now_ns

        await asyncio.sleep(0.01)
        t = now_ns()
        return HttpResponse(500, {}, t, t, b'{"error": {"code": 500, "message": "boom", "type": "server_error"}}')

    async def close(self) -> None:
        pass


def test_http_errors_of_a_live_server_are_not_paused_after():
    # The pause is for a server that cannot be reached; an answered request (even a 500) is
    # followed by the next one at once, or the level measures its own back-off.
    level = LevelRun(target="t", concurrency=2)
    options = EngineOptions(give_up_after=None, pause_after_connect_error_s=0.5)
    asyncio.run(run_level(level, Http500Transport(), BACKEND, requests=None, duration_s=0.5, options=options))
    assert all(r.error_kind == "http_500" for r in level.records)
    # 2 workers, 10 ms per answer, for 0.5 s: about 100 (4 with a 0.5 s pause after each)
    assert len(level.records) >= 30
