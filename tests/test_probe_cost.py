"""The probe must not disturb the server it watches (issue 32): one connection at a time, closed
after every answer, /metrics then /slots; a schedule dense at a level's start and never more than
PROBE_COST_SHARE of one HTTP thread's time."""

from __future__ import annotations

import asyncio
import json

import pytest

from httpfixture import RawHttpServer
from loadgen.client.probe import DENSE_SCRAPES, Probe, ServerInfo, scrape_delay_s

METRICS = (b"# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 1\n"
           b"# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred 0\n")
SLOTS = json.dumps([{"id": 0, "is_processing": True}, {"id": 1, "is_processing": False}]).encode()


async def answer(request, writer) -> bool:
    body = METRICS if request.path == "/metrics" else SLOTS
    kind = b"text/plain" if request.path == "/metrics" else b"application/json"
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: " + kind + b"\r\nContent-Length: "
                 + str(len(body)).encode() + b"\r\nConnection: keep-alive\r\n\r\n" + body)
    await writer.drain()
    return True  # the server would keep the connection: the probe must close it


def test_scrapes_use_one_closed_connection_each_and_never_two_at_once():
    async def main():
        async with RawHttpServer(answer) as server:
            info = ServerInfo(metrics_enabled=True, slots_enabled=True, slot_count=2)
            samples: list = []
            async with Probe(server.url) as probe:
                task = asyncio.ensure_future(probe.sample_until_cancelled("t", 1, info, 0.02, samples))
                while len(samples) < 6:
                    await asyncio.sleep(0.01)
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            return server, samples

    server, samples = asyncio.run(main())
    assert server.max_open_connections == 1
    assert all(r.headers.get("connection") == "close" for r in server.requests)
    assert all(r.index_on_connection == 0 for r in server.requests)  # never a second request on one
    assert [r.path for r in server.requests[:4]] == ["/metrics", "/slots", "/metrics", "/slots"]
    assert samples[0].requests_processing == 1 and samples[0].busy_slots == 1
    assert all(s.scrape_us is not None and s.scrape_us >= 0 for s in samples)


# (scrape index, interval s, last scrape's duration s, expected delay s), written down first
SCHEDULE = [
    (0, 0.25, 0.001, 0.0625),  # dense at a level's start: a quarter of the interval
    (DENSE_SCRAPES - 2, 0.25, 0.001, 0.0625),
    (DENSE_SCRAPES - 1, 0.25, 0.001, 0.25),  # then the interval
    (100, 0.25, 0.001, 0.25),
    (0, 0.05, 0.0001, 0.025),  # never denser than 25 ms
    (0, 0.01, 0.0001, 0.01),  # nor sparser than the interval asked for
    (0, 0.25, 0.010, 0.2),  # a 10 ms scrape: at most 5% of the thread's time
    (100, 0.25, 0.100, 2.0),  # a server slow to answer is asked less often
]


@pytest.mark.parametrize("index,interval,last,expected", SCHEDULE)
def test_the_scrape_schedule(index, interval, last, expected):
    assert scrape_delay_s(index, interval, last) == pytest.approx(expected)
