"""Open-loop schedules and the engine against a local fixture server: coordinated omission,
rate accuracy, streaming through the transport, and the API key."""

from __future__ import annotations

import asyncio
import json
import threading

import numpy as np
import pytest

from fixture_server import Behaviour, FixtureServer, chat_stream, completion_stream, sse
from loadgen.analysis import aggregate, metrics
from loadgen.client.aiohttp_transport import AiohttpTransport
from loadgen.client.backends import GenerationParams, make_backend
from loadgen.core import records
from loadgen.core.records import LevelRun
from loadgen.run.engine import run_level, run_open_level
from loadgen.run.looplag import LoopLagSampler
from loadgen.run.loops import loop_factory
from loadgen.run.schedule import arrival_offsets_ns
from oracles import realised_rate

# ---------------------------------------------------------------- schedules (pure)

def test_constant_schedule_is_exact_and_bounded_by_duration():
    offsets = arrival_offsets_ns(20, requests=None, duration_s=10, arrival="constant")
    assert len(offsets) == 200
    assert offsets[0] == 0 and offsets[-1] == 9_950_000_000
    assert set(np.diff(offsets)) == {50_000_000}


@pytest.mark.parametrize("arrival,burstiness", [("poisson", 1.0), ("gamma", 0.25), ("gamma", 4.0)])
def test_random_schedules_have_the_asked_mean_rate_and_are_seeded(arrival, burstiness):
    a = arrival_offsets_ns(50, requests=20_000, duration_s=None, arrival=arrival, burstiness=burstiness, seed=3)
    b = arrival_offsets_ns(50, requests=20_000, duration_s=None, arrival=arrival, burstiness=burstiness, seed=3)
    assert np.array_equal(a, b)
    gaps = np.diff(a) / 1e9
    assert gaps.mean() == pytest.approx(1 / 50, rel=0.05)
    # gamma shape k: coefficient of variation 1/sqrt(k) (Poisson: 1)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / np.sqrt(burstiness), rel=0.1)
    assert np.all(np.diff(a) >= 0)


def test_requests_and_duration_both_bound_a_schedule():
    assert len(arrival_offsets_ns(10, requests=5, duration_s=100, arrival="constant")) == 5
    assert len(arrival_offsets_ns(10, requests=None, duration_s=1, arrival="constant")) == 10


# ---------------------------------------------------------------- engine against a fixture server

def run(coro_fn):
    factory, _ = loop_factory()
    loop = factory()
    try:
        return loop.run_until_complete(coro_fn())
    finally:
        loop.close()


async def level_against(behaviour: Behaviour, *, api="llamacpp", stream=False, rate=None, offsets=None,
                        max_in_flight=None, concurrency=1, requests=4) -> tuple[LevelRun, FixtureServer]:
    server = await FixtureServer(behaviour).start()
    transport = AiohttpTransport()
    await transport.open(server.url, max_in_flight or (0 if rate else concurrency), 30)
    backend = make_backend(api, GenerationParams(prompt="p", n_predict=8, stream=stream),
                           "fixture-model" if api != "llamacpp" else None)
    try:
        if rate is None:
            level = LevelRun(target="fx", concurrency=concurrency)
            await run_level(level, transport, backend, requests=requests, duration_s=None)
        else:
            level = LevelRun(target="fx", concurrency=max_in_flight or 0, rate=rate)
            await run_open_level(level, transport, backend, offsets, max_in_flight=max_in_flight)
    finally:
        await transport.close()
        await server.stop()
    return level, server


def test_a_stall_shows_in_the_corrected_p99_and_not_in_the_uncorrected_one():
    # 10 req/s for 12 s, one request in flight at most; request 20 takes 2 s. The ~20 requests due
    # during that stall leave late: measured from their actual send they look instant, measured
    # from when they should have left they waited up to 2 s.
    offsets = arrival_offsets_ns(10, requests=120, duration_s=None, arrival="constant")
    behaviour = Behaviour(stall_s=lambda n: 2.0 if n == 20 else 0.0)
    level, _ = run(lambda: level_against(behaviour, rate=10.0, offsets=offsets, max_in_flight=1))
    assert len(level.records) == 120 and all(r.ok for r in level.records)
    summary = aggregate.summarize_level(1, level.records, rate=10.0)
    assert summary.latency_ms.p99 >= 1500
    assert summary.latency_uncorrected_ms.p99 < 500
    assert summary.schedule_lag_ms.max >= 1500  # the blocked sends were late, and say so
    delayed = [r for r in level.records if metrics.schedule_lag_ms(r) > 1000]
    assert len(delayed) >= 10  # nothing skipped: the blocked requests were sent, late


def test_a_constant_20_per_second_schedule_sends_200_requests_on_time():
    offsets = arrival_offsets_ns(20, requests=None, duration_s=10, arrival="constant")

    async def sampled():
        sampler = LoopLagSampler().start()
        try:
            return await level_against(Behaviour(), rate=20.0, offsets=offsets)
        finally:
            loop_load.append(sampler.stop())

    loop_load: list = []
    level, server = run(sampled)
    assert server.requests == len(level.records)
    assert 198 <= len(level.records) <= 202
    records_by_seq = sorted(level.records, key=lambda r: r.seq)
    assert [r.start_ns - level.start_ns for r in records_by_seq] == [int(o) for o in offsets]  # as scheduled
    lag = metrics.distribution_ms([metrics.schedule_lag_ms(r) for r in level.records])
    loop_lag_max = loop_load[0].loop_lag_max_ms
    print(f"schedule lag p50 {lag.p50:.3f} ms, p99 {lag.p99:.3f} ms, max {lag.max:.3f} ms; "
          f"event-loop lag max {loop_lag_max:.3f} ms")
    # A dispatcher that bunched sends or slept in coarse steps would be late most of the time; the
    # rest of the lag is the loop's (a process descheduled on a busy machine, the server's work on
    # the same loop): a send is no later than the loop's worst lag, which the sampler (10 ms ticks)
    # sees to within a tick, plus the few ms it takes to send. How small the lag is on a quiet
    # machine is for benchmarks, not for a test.
    # (p50 < 5 ms failed at 5.2 ms at load average 16 on 2 cores: the loop's own p99 lag is the bound.)
    assert lag.p50 < loop_load[0].loop_lag_p99_ms + 5
    assert lag.p99 < loop_lag_max + 10 + 5


@pytest.mark.parametrize("api,events", [("llamacpp", completion_stream(8)), ("chat", chat_stream(8))])
def test_streams_through_the_transport_record_ttft_and_gaps(api, events):
    behaviour = Behaviour(events=events, event_gap_s=0.01)
    level, _ = run(lambda: level_against(behaviour, api=api, stream=True, requests=3))
    for r in level.records:
        assert r.ok, r.error_message
        assert r.chunks == 8 and r.output_tokens == 8
        assert r.start_ns < r.headers_ns <= r.first_token_ns < r.last_token_ns <= r.complete_ns
        assert len(r.chunk_gaps_us) == 7 and min(r.chunk_gaps_us) >= 5_000
        assert metrics.ttft_ms(r) < metrics.latency_ms(r)
        assert metrics.tpot_ms(r) == pytest.approx((r.last_token_ns - r.first_token_ns) / 1e6 / 7)


@pytest.mark.parametrize("events,kind", [
    (completion_stream(8)[:-1], records.TRUNCATED_STREAM),
    (completion_stream(8)[:3] + [sse({"error": {"code": 500, "message": "boom"}})], records.STREAM_ERROR),
])
def test_broken_streams_are_recorded_with_their_kind(events, kind):
    level, _ = run(lambda: level_against(Behaviour(events=events), stream=True, requests=2))
    assert [r.error_kind for r in level.records] == [kind, kind]
    assert aggregate.summarize_level(1, level.records).requests_failed == 2


def test_an_error_status_before_the_stream_is_read_as_json():
    body = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
    level, _ = run(lambda: level_against(Behaviour(status=503, body=body), stream=True, requests=1))
    assert level.records[0].error_kind == "http_503"
    assert level.records[0].error_message == "Loading model"


def test_multi_token_chunks_count_the_servers_tokens_not_chunks():
    events = [sse({"choices": [{"index": 0, "delta": {"content": "abcd"}}]}) for _ in range(4)]
    events += [sse({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 16, "total_tokens": 17}}),
               sse("[DONE]")]
    level, _ = run(lambda: level_against(Behaviour(events=events, event_gap_s=0.005), api="chat", stream=True,
                                         requests=1))
    r = level.records[0]
    assert r.ok and r.chunks == 4 and r.output_tokens == 16
    assert metrics.tpot_ms(r) == pytest.approx((r.last_token_ns - r.first_token_ns) / 1e6 / 15)


# ---------------------------------------------------------------- the CLI: API key, modes

@pytest.fixture
def threaded_fixture():
    """A fixture server on its own loop in a thread, for tests that run the CLI in-process."""
    ready = threading.Event()
    state: dict = {}

    def serve() -> None:
        loop = asyncio.new_event_loop()
        state["loop"] = loop
        state["server"] = loop.run_until_complete(FixtureServer().start())
        ready.set()
        loop.run_forever()
        loop.run_until_complete(state["server"].stop())
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(10)
    yield state["server"]
    state["loop"].call_soon_threadsafe(state["loop"].stop)
    thread.join(10)


SECRET = "sk-test-5f1e0c9a-do-not-print"


def test_the_api_key_is_sent_everywhere_and_written_nowhere(threaded_fixture, loadgen, tmp_path, monkeypatch):
    monkeypatch.setenv("LOADGEN_API_KEY", SECRET)
    out = tmp_path / "run"
    code, stdout, stderr = loadgen("sweep", "--url", threaded_fixture.url, "--api", "chat", "--concurrency", "1",
                                   "--requests", "2", "--warmup", "0", "--output", out)
    assert code == 0, stderr
    auth = [h.get("Authorization") for h in threaded_fixture.seen_headers]
    assert auth and set(auth) == {f"Bearer {SECRET}"}  # completions, /health, /props, /metrics, ...
    assert json.loads(threaded_fixture.seen_bodies[0])["model"] == "fixture-model"  # from /v1/models
    for f in out.rglob("*"):
        if f.is_file():
            assert SECRET not in f.read_text(errors="replace"), f
    assert SECRET not in stdout + stderr
    doc = json.loads((out / "run.json").read_text())
    assert doc["config"]["api_key_set"] is True


def test_an_api_key_flag_is_masked_in_the_recorded_command(threaded_fixture, loadgen, tmp_path):
    out = tmp_path / "run"
    code, _, stderr = loadgen("sweep", "--url", threaded_fixture.url, "--api-key", SECRET, "--concurrency", "1",
                              "--requests", "1", "--warmup", "0", "--output", out)
    assert code == 0, stderr
    assert SECRET not in (out / "run.json").read_text()
    assert "***" in json.loads((out / "run.json").read_text())["command"]


def test_a_rate_sweep_writes_rate_levels_and_both_latencies(threaded_fixture, loadgen, tmp_path):
    out = tmp_path / "run"
    code, stdout, stderr = loadgen("sweep", "--url", threaded_fixture.url, "--rate", "20,40", "--arrival", "constant",
                                   "--duration", "1", "--stream", "--warmup", "0", "--output", out)
    assert code == 0, stderr
    doc = json.loads((out / "run.json").read_text())
    assert doc["config"]["mode"] == "rate"
    levels = doc["targets"][0]["levels"]
    assert [lv["level"] for lv in levels] == [20.0, 40.0]
    assert [lv["requests_ok"] for lv in levels] == [20, 40]
    assert all(lv["latency_uncorrected_ms"] and lv["schedule_lag_ms"] for lv in levels)
    assert "req/s" in stdout
    code, stdout, _ = loadgen("analyze", out)
    assert code == 0 and "req/s" in stdout


@pytest.mark.parametrize("args,message", [
    (["--rate", "1", "--concurrency", "2"], "not both"),
    (["--rate", "0"], "not a positive rate"),
    (["--rate", "1,x"], "not a number"),
    (["--rate", "1", "--arrival", "gamma", "--burstiness", "0"], "positive gamma shape"),
    (["--max-in-flight", "4"], "need --rate"),
    (["--api", "grpc"], "choose one of"),
    (["--model", "m"], "--model applies to"),
])
def test_bad_open_loop_and_api_input_is_one_line(loadgen, args, message):
    code, out, err = loadgen("sweep", "--ports", "9", *args)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("arrival,burstiness", [("poisson", 1.0), ("gamma", 0.5)])
@pytest.mark.parametrize("requests,duration_s", [(12, None), (20, None), (None, 4.0)])
def test_every_level_schedule_runs_at_its_nominal_rate_however_few_its_requests(arrival, burstiness, requests,
                                                                                duration_s):
    # The same seed's unit gaps used to be reused at every rate: a short draw whose mean was off by
    # chance put every level that many percent below (or above) its nominal rate.
    for rate in (2.0, 5.0, 10.0, 20.0, 40.0):
        offsets = arrival_offsets_ns(rate, requests=requests, duration_s=duration_s, arrival=arrival,
                                     burstiness=burstiness, seed=0)
        realised = (len(offsets) - 1) / (offsets[-1] / 1e9)
        assert realised == pytest.approx(rate, rel=0.01), (rate, realised)
        assert realised_rate(offsets) == pytest.approx(realised)
        if duration_s is not None:
            assert len(offsets) == len(arrival_offsets_ns(rate, requests=None, duration_s=duration_s,
                                                          arrival="constant"))
    # still random, and still seeded
    a = arrival_offsets_ns(5.0, requests=20, duration_s=None, arrival=arrival, burstiness=burstiness, seed=1)
    assert np.array_equal(a, arrival_offsets_ns(5.0, requests=20, duration_s=None, arrival=arrival,
                                                burstiness=burstiness, seed=1))
    assert len(set(np.diff(a).tolist())) > 10


def test_a_poisson_rate_sweep_records_and_shows_the_rate_it_achieved(threaded_fixture, loadgen, tmp_path):
    out = tmp_path / "run"
    code, stdout, stderr = loadgen("sweep", "--url", threaded_fixture.url, "--rate", "5,10,20", "--arrival", "poisson",
                                   "--requests", "10", "--warmup", "0", "--no-histograms", "--output", out)
    assert code == 0, stderr
    levels = json.loads((out / "run.json").read_text())["targets"][0]["levels"]
    for lv in levels:  # the schedule runs at the nominal rate; the sends follow it within their lag
        assert lv["achieved_rate"] == pytest.approx(lv["rate"], rel=0.1), lv
    assert "achieved" in stdout
    code, stdout, _ = loadgen("analyze", out)
    assert code == 0 and f"{levels[0]['achieved_rate']:,.2f}" in stdout
