"""The simulated llama-server, through its public API: start_simulator, HTTP, the CLI.

Every server listens on 127.0.0.1 on a free port and is stopped by `async with`.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from typing import Any

import aiohttp
import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from loadgen.sim import FaultConfig, builtin_profiles, load_profile, parse_fault, start_simulator
from loadgen.sim.cli import sim_command
from servers import SimProcess

SMOKE = load_profile("smoke")
MOE = load_profile("moe-35b-a3b")
DENSE = load_profile("dense-27b")
PLAIN = {"prompt": "Hello", "n_predict": 6, "ignore_eos": True}
STREAM = {**PLAIN, "stream": True}


def run(coro: Any, timeout: float = 20) -> Any:
    """pytest-asyncio is not available: each test runs its own event loop."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


def run_timed(make_coro: Any, attempts: int = 3) -> None:
    """Run a timing test until one attempt passes. The simulator's model is deterministic but a shared
    2-core machine is not: a process descheduled for 100+ ms misses any fixed tolerance."""
    for attempt in range(attempts):
        try:
            run(make_coro())
            return
        except AssertionError:
            if attempt == attempts - 1:
                raise


async def metrics(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with session.get(url + "/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples}


async def metrics_when(session: aiohttp.ClientSession, url: str, condition: Any, timeout: float = 10) -> dict[str, float]:
    """Scrape /metrics until `condition(values)` holds: wait for a state, do not sleep and hope for it."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition(values := await metrics(session, url)):
        assert asyncio.get_running_loop().time() < deadline, values
        await asyncio.sleep(0.002)
    return values


async def post(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with session.post(url, json=body) as resp:
        return resp.status, await resp.json()


async def sse_events(resp: aiohttp.ClientResponse) -> list[bytes]:
    """The payloads of `data: ...` lines, in order."""
    return [line[6:].rstrip(b"\n") async for line in resp.content if line.startswith(b"data: ")]


# --- profiles -------------------------------------------------------------------------------------

def aggregate_tok_s(profile, busy: int) -> float:
    """Tokens per second over all `busy` slots in steady decoding: b * 1000 / step_ms(b)."""
    return busy * 1000.0 / profile.decode_step_ms(busy)


def test_builtin_profiles_are_calibrated_to_the_field_report():
    assert {"moe-35b-a3b", "dense-27b", "smoke"} <= set(builtin_profiles())
    # llama-bench tg128 single-stream decode and the 4-slot aggregate of the concurrency table.
    assert aggregate_tok_s(MOE, 1) == pytest.approx(47.63, rel=1e-3)
    assert aggregate_tok_s(MOE, 4) == pytest.approx(72.18, rel=1e-3)
    assert MOE.prefill_tok_s == pytest.approx(835.51)
    assert aggregate_tok_s(DENSE, 1) == pytest.approx(11.70, rel=1e-3)
    assert aggregate_tok_s(DENSE, 4) == pytest.approx(17.69, rel=1e-3)
    assert DENSE.prefill_tok_s == pytest.approx(128.21)


def test_bad_profiles_are_one_line_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown profile 'nope'") as err:
        load_profile("nope")
    assert "\n" not in str(err.value)
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\nmodel_alias = "x"\nprefill_tok_s = 1\nstep_ms = 1\nalpha = 0\n'
                   'n_ctx = 64\neos_probability = 0\nwarp = 9\n')
    with pytest.raises(ValueError, match="unknown field 'warp'"):
        load_profile(str(bad))
    good = tmp_path / "good.toml"
    good.write_text('name = "x"\nmodel_alias = "x"\nprefill_tok_s = 1000\nstep_ms = 5\nalpha = 0.5\n'
                    'n_ctx = 64\neos_probability = 0\nfaults = ["http_500:0.5"]\n')
    profile = load_profile(str(good))
    assert profile.decode_step_ms(3) == pytest.approx(10.0)
    assert profile.faults.rules[0].share == 0.5


# --- scheduling -----------------------------------------------------------------------------------

def test_one_slot_defers_three_of_four_and_serves_them_in_fifo_order():
    async def main():
        async with await start_simulator(SMOKE, slots=1) as sim, aiohttp.ClientSession() as session:
            finished: list[int] = []

            # The first request holds the slot for ~1 s (500 steps of 2 ms), long after the others
            # arrived, however slowly a loaded machine runs this loop.
            lengths = [500, 25, 25, 25]

            async def request(i: int) -> None:
                status, body = await post(session, sim.url + "/completion",
                                          {"prompt": f"request {i}", "n_predict": lengths[i], "ignore_eos": True})
                assert status == 200 and body["tokens_predicted"] == lengths[i]
                finished.append(i)

            tasks = []
            for i in range(4):
                tasks.append(asyncio.create_task(request(i)))
                # a known arrival order: the next one leaves once the server has this one
                await metrics_when(session, sim.url,
                                   lambda v, i=i: v["llamacpp:requests_processing"] + v["llamacpp:requests_deferred"] == i + 1)
            values = await metrics(session, sim.url)
            assert (values["llamacpp:requests_processing"], values["llamacpp:requests_deferred"]) == (1, 3)
            await asyncio.gather(*tasks)
            assert finished == [0, 1, 2, 3]
            final = await metrics(session, sim.url)
            assert final["llamacpp:requests_deferred"] == 0
            assert final["llamacpp:tokens_predicted_total"] == sum(lengths)
    run(main())


def test_four_slot_aggregate_matches_the_profile():
    # Two rounds of 4 concurrent requests, 200 and 1000 tokens each, at 1/100 of real time. The
    # difference between the rounds cancels what does not grow with the answer (connections, HTTP,
    # the prompt, the ramp-up), leaving 4 * 800 tokens of steady 4-slot decoding.
    scale = 0.01

    async def main():
        async with await start_simulator(MOE, slots=4, time_scale=scale) as sim, \
                aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=4)) as session:
            async def one_round(n_predict: int) -> tuple[float, list[dict[str, Any]]]:
                body = {"n_predict": n_predict, "ignore_eos": True, "cache_prompt": False}
                started = time.monotonic()
                answers = await asyncio.gather(*(post(session, sim.url + "/completion",
                                                      {**body, "prompt": f"[{n_predict}-{i}] go"}) for i in range(4)))
                assert all(a["tokens_predicted"] == n_predict for _, a in answers)
                return time.monotonic() - started, [a for _, a in answers]

            short_s, _ = await one_round(200)
            long_s, answers = await one_round(1000)
        simulated_s = (long_s - short_s) / scale
        assert 4 * 800 / simulated_s == pytest.approx(aggregate_tok_s(MOE, 4), rel=0.05)
        # The server's own timings: each stream decodes at 1000 / step_ms(4) tokens per second.
        for answer in answers:
            timings = answer["timings"]
            per_stream = (timings["predicted_n"] - 1) / (timings["predicted_ms"] / scale) * 1000
            assert per_stream == pytest.approx(1000 / MOE.decode_step_ms(4), rel=0.05)
    run_timed(main)


def test_reported_timings_add_up_to_the_client_latency():
    scale = 0.05

    async def main():
        async with await start_simulator(DENSE, slots=1, time_scale=scale) as sim, \
                aiohttp.ClientSession() as session:
            prompt = "Describe mixture of experts routing in exactly three sentences. " * 4
            started = time.monotonic()
            status, body = await post(session, sim.url + "/completion",
                                      {"prompt": prompt, "n_predict": 40, "ignore_eos": True, "cache_prompt": False})
            latency_ms = (time.monotonic() - started) * 1000
        timings = body["timings"]
        # prompt_ms: prompt tokens at prefill_tok_s; predicted_ms: 39 single-stream steps; both scaled.
        # The steps keep to a schedule from the prefill's start: a busy machine can make the first
        # token late and the rest catch up (predicted_ms then reads short: 152.7 for 166.7 ms at load
        # ~6), but never make the whole earlier than the model, only later by a wake-up delay.
        prefill_ms = DENSE.prefill_ms(timings["prompt_n"]) * scale
        model_ms = prefill_ms + 39 * DENSE.step_ms * scale
        assert prefill_ms * 0.99 <= timings["prompt_ms"] <= prefill_ms + 20
        assert model_ms * 0.99 <= timings["prompt_ms"] + timings["predicted_ms"] <= model_ms + 20
        assert timings["prompt_ms"] + timings["predicted_ms"] <= latency_ms < \
            timings["prompt_ms"] + timings["predicted_ms"] + 50
    run_timed(main)


def test_cache_prompt_reuses_a_repeated_prompt_and_not_a_salted_one():
    async def main():
        async with await start_simulator(SMOKE, slots=2) as sim, aiohttp.ClientSession() as session:
            url = sim.url + "/completion"
            prompt = "Describe mixture of experts routing in exactly three sentences."
            _, first = await post(session, url, {"prompt": prompt, "n_predict": 4})
            _, second = await post(session, url, {"prompt": prompt, "n_predict": 4})  # cache_prompt defaults to true
            assert first["timings"]["cache_n"] == 0
            assert second["timings"]["cache_n"] == first["tokens_evaluated"] - 1  # the last token is recomputed
            assert second["timings"]["prompt_n"] == 1
            for _ in range(2):
                _, salted = await post(session, url, {"prompt": f"[{uuid.uuid4()}] {prompt}", "n_predict": 4,
                                                      "cache_prompt": False})
                assert salted["timings"]["cache_n"] == 0
                assert salted["timings"]["prompt_n"] == salted["tokens_evaluated"]
            values = await metrics(session, sim.url)
            assert values["llamacpp:prompt_tokens_cached_total"] == second["timings"]["cache_n"]
    run(main())


def test_same_seed_same_text_and_eos_stops():
    async def generate(seed: int) -> list[dict[str, Any]]:
        async with await start_simulator(SMOKE, slots=1, seed=seed) as sim, aiohttp.ClientSession() as session:
            return [(await post(session, sim.url + "/completion", {"prompt": f"p{i}", "n_predict": 200}))[1]
                    for i in range(5)]

    async def main():
        a, b, c = await generate(1), await generate(1), await generate(2)
        assert [r["content"] for r in a] == [r["content"] for r in b]
        assert [r["content"] for r in a] != [r["content"] for r in c]
        # eos_probability 0.02 per token: within 200 tokens most requests meet an EOS.
        assert any(r["stop_type"] == "eos" and r["tokens_predicted"] < 200 for r in a)
    run(main())


def test_a_queued_stream_gets_no_headers_until_a_slot_starts_it():
    async def main():
        async with await start_simulator(SMOKE, slots=1) as sim, aiohttp.ClientSession() as session:
            busy = asyncio.create_task(post(session, sim.url + "/completion",
                                            {"prompt": "busy", "n_predict": 300, "ignore_eos": True}))
            await metrics_when(session, sim.url, lambda v: v["llamacpp:requests_processing"] == 1)
            headers = asyncio.create_task(session.post(sim.url + "/completion",
                                                       json={**STREAM, "prompt": "queued"}))
            await metrics_when(session, sim.url, lambda v: v["llamacpp:requests_deferred"] == 1)
            assert not busy.done() and not headers.done()  # deferred: nothing sent yet
            await busy
            resp = await asyncio.wait_for(headers, 1)
            assert resp.status == 200 and resp.content_type == "text/event-stream"
            assert len(await sse_events(resp)) == 7
            resp.release()
    run(main())


def test_client_disconnect_frees_the_slot_and_the_queue():
    async def main():
        async with await start_simulator(SMOKE, slots=1) as sim, aiohttp.ClientSession() as session:
            body = {"prompt": "long", "n_predict": 100_000, "ignore_eos": True}
            for _ in range(2):  # one running, one deferred
                with pytest.raises(asyncio.TimeoutError):
                    await session.post(sim.url + "/completion", json=body, timeout=aiohttp.ClientTimeout(total=0.1))
            # both freed once the server sees the disconnects (not after a guessed time)
            await metrics_when(session, sim.url, lambda v: v["llamacpp:requests_processing"] == 0
                               and v["llamacpp:requests_deferred"] == 0)
            status, result = await post(session, sim.url + "/completion", {"prompt": "next", "n_predict": 3})
            assert status == 200 and result["tokens_predicted"] == 3
    run(main())


def test_prompt_longer_than_the_context_is_refused_once_it_has_a_slot():
    async def main():
        async with await start_simulator(SMOKE, slots=1) as sim, aiohttp.ClientSession() as session:
            long_prompt = "word " * (SMOKE.n_ctx + 10)
            for stream in (False, True):
                async with session.post(sim.url + "/completion",
                                        json={"prompt": long_prompt, "stream": stream}) as resp:
                    assert resp.status == 400
                    assert resp.content_type == "application/json"
                    error = (await resp.json())["error"]
                assert error["type"] == "exceed_context_size_error"
                assert error["code"] == 400
                assert error["n_ctx"] == SMOKE.n_ctx
                assert error["n_prompt_tokens"] > SMOKE.n_ctx
    run(main())


def test_missing_prompt_is_invalid_request():
    async def main():
        async with await start_simulator(SMOKE) as sim, aiohttp.ClientSession() as session:
            for path, body in (("/completion", {"n_predict": 3}), ("/v1/completions", {}),
                               ("/v1/chat/completions", {"max_tokens": 3})):
                status, answer = await post(session, sim.url + path, body)
                assert status == 400
                assert answer["error"]["type"] == "invalid_request_error"
                assert set(answer["error"]) == {"code", "message", "type"}
    run(main())


def test_fields_of_the_wrong_type_or_out_of_range_are_invalid_requests():
    async def main():
        async with await start_simulator(SMOKE, slots=2) as sim, aiohttp.ClientSession() as session:
            url = sim.url + "/completion"
            for body, field in (({"prompt": "x", "n_predict": "ten"}, "n_predict"),
                                ({"prompt": "x", "max_tokens": -5}, "max_tokens"),
                                ({"prompt": "x", "stream": 1}, "stream"),
                                ({"prompt": "x", "n_cmpl": 3}, "n_cmpl")):
                status, answer = await post(session, url, body)
                assert status == 400, body
                assert answer["error"]["type"] == "invalid_request_error"
                assert answer["error"]["message"].startswith(f"Field '{field}': ")
            # null means absent; n_predict 0 still samples one token
            status, answer = await post(session, url, {"prompt": "x", "n_predict": 0, "temperature": None})
            assert status == 200 and answer["tokens_predicted"] == 1 and answer["stop_type"] == "limit"
            async with session.post(url, data=b"{not json") as resp:
                assert resp.status == 400
    run(main())


def test_stop_word_ends_the_answer_before_it():
    async def main():
        async with await start_simulator(SMOKE, slots=1) as sim, aiohttp.ClientSession() as session:
            # Generated sentences end with "."; the word and what follows it are not returned.
            request = {"prompt": "x", "n_predict": 100, "ignore_eos": True, "stop": ["."], "seed": 42}
            status, body = await post(session, sim.url + "/completion", request)
            assert body["stop_type"] == "word" and body["stopping_word"] == "."
            assert "." not in body["content"] and body["tokens_predicted"] < 100
            async with session.post(sim.url + "/completion", json={**request, "stream": True}) as resp:
                events = [json.loads(e) for e in await sse_events(resp)]
            assert "".join(e["content"] for e in events[:-1]) == body["content"]  # same request seed, same text
            assert events[-1]["stop_type"] == "word"
    run(main())


# --- response shapes ------------------------------------------------------------------------------

TIMINGS_KEYS = {"cache_n", "prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second", "predicted_n",
                "predicted_ms", "predicted_per_token_ms", "predicted_per_second"}
FINAL_KEYS = {"index", "content", "tokens", "id_slot", "stop", "model", "tokens_predicted", "tokens_evaluated",
              "generation_settings", "prompt", "has_new_line", "truncated", "stop_type", "stopping_word",
              "tokens_cached", "timings"}


def test_completion_shapes():
    async def main():
        async with await start_simulator(SMOKE, slots=2) as sim, aiohttp.ClientSession() as session:
            url = sim.url + "/completion"
            status, body = await post(session, url, {"prompt": "Hello there", "max_tokens": 6, "ignore_eos": True})
            assert status == 200
            assert set(body) == FINAL_KEYS
            assert set(body["timings"]) == TIMINGS_KEYS
            assert body["stop"] is True and body["stop_type"] == "limit" and body["content"]
            assert body["tokens_predicted"] == body["timings"]["predicted_n"] == 6  # the first token counts
            assert body["tokens_evaluated"] == body["timings"]["prompt_n"] + body["timings"]["cache_n"]
            assert body["model"] == SMOKE.model_alias
            assert body["generation_settings"]["n_predict"] == 6

            async with session.post(url, json={"prompt": "Hello again", "n_predict": 5, "ignore_eos": True,
                                               "stream": True}) as resp:
                assert resp.status == 200
                assert resp.content_type == "text/event-stream"
                events = [json.loads(e) for e in await sse_events(resp)]
            *chunks, final = events
            assert len(chunks) == 5
            for n, chunk in enumerate(chunks, 1):
                assert set(chunk) == {"index", "content", "tokens", "stop", "id_slot", "tokens_predicted",
                                      "tokens_evaluated"}
                assert chunk["stop"] is False and chunk["tokens_predicted"] == n and len(chunk["tokens"]) == 1
            assert set(final) == FINAL_KEYS
            assert final["stop"] is True and final["timings"]["predicted_n"] == 5
            assert final["content"] == ""  # the text went out in the chunks; no [DONE] follows
    run(main())


def test_openai_shapes():
    async def main():
        async with await start_simulator(SMOKE, slots=2) as sim, aiohttp.ClientSession() as session:
            status, body = await post(session, sim.url + "/v1/completions",
                                      {"prompt": "Hi", "max_tokens": 4, "ignore_eos": True})
            assert status == 200 and body["object"] == "text_completion"
            assert body["choices"][0]["finish_reason"] == "length"
            assert body["usage"]["completion_tokens"] == 4
            assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 4
            assert set(body["timings"]) == TIMINGS_KEYS

            messages = [{"role": "user", "content": "Hi"}]
            status, body = await post(session, sim.url + "/v1/chat/completions",
                                      {"messages": messages, "max_tokens": 4, "ignore_eos": True})
            assert status == 200 and body["object"] == "chat.completion"
            assert body["choices"][0]["message"]["role"] == "assistant"
            assert body["usage"]["completion_tokens"] == 4 and "timings" in body

            async with session.post(sim.url + "/v1/completions",
                                    json={"prompt": "Hi", "max_tokens": 3, "ignore_eos": True, "stream": True}) as resp:
                events = await sse_events(resp)
            assert events[-1] == b"[DONE]"
            last = json.loads(events[-2])
            assert last["choices"][0]["finish_reason"] == "length" and "usage" in last and "timings" in last

            for include_usage in (False, True):
                async with session.post(sim.url + "/v1/chat/completions", json={
                        "messages": messages, "max_tokens": 3, "ignore_eos": True, "stream": True,
                        "stream_options": {"include_usage": include_usage}}) as resp:
                    events = await sse_events(resp)
                assert events[-1] == b"[DONE]"
                chunks = [json.loads(e) for e in events[:-1]]
                assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
                assert all(c["object"] == "chat.completion.chunk" for c in chunks)
                usage = [c for c in chunks if "usage" in c]
                assert len(usage) == include_usage
                assert "timings" in chunks[-1]
                finish = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
                assert finish[0]["choices"][0]["finish_reason"] == "length"
    run(main())


def test_management_endpoint_shapes():
    async def main():
        async with await start_simulator(SMOKE, slots=3) as sim, aiohttp.ClientSession() as session:
            async with session.get(sim.url + "/props") as resp:
                props = await resp.json()
            assert props["total_slots"] == 3
            assert props["default_generation_settings"]["n_ctx"] == SMOKE.n_ctx
            assert "params" in props["default_generation_settings"]
            assert props["model_alias"] == SMOKE.model_alias and props["model_path"]
            assert props["build_info"] and props["endpoint_slots"] is True and props["endpoint_metrics"] is True

            async with session.get(sim.url + "/v1/models") as resp:
                models = await resp.json()
            assert models["data"][0]["id"] == SMOKE.model_alias and "n_ctx_train" in models["data"][0]["meta"]

            async with session.get(sim.url + "/health") as resp:
                assert resp.status == 200 and await resp.json() == {"status": "ok"}

            async with session.post(sim.url + "/tokenize", json={"content": "Hello world"}) as resp:
                tokens = (await resp.json())["tokens"]
            assert tokens and all(isinstance(t, int) for t in tokens)

            # /slots while one request decodes.
            request = asyncio.create_task(post(session, sim.url + "/completion",
                                               {"prompt": "busy", "n_predict": 400, "ignore_eos": True}))
            busy = []
            while not busy:
                await asyncio.sleep(0.005)
                async with session.get(sim.url + "/slots") as resp:
                    slots = await resp.json()
                busy = [s for s in slots if s["is_processing"]]
            assert len(slots) == 3
            slot = busy[0]
            assert {"id", "n_ctx", "is_processing", "id_task", "n_prompt_tokens", "next_token", "params"} <= set(slot)
            assert slot["next_token"][0]["n_decoded"] + slot["next_token"][0]["n_remain"] == 400
            assert set(next(s for s in slots if not s["is_processing"])) == {"id", "n_ctx", "speculative",
                                                                             "is_processing"}
            await request
    run(main())


def test_metrics_names_types_and_formatting():
    async def main():
        async with await start_simulator(SMOKE, slots=2) as sim, aiohttp.ClientSession() as session:
            await post(session, sim.url + "/completion", {"prompt": "Hello", "n_predict": 8, "ignore_eos": True})
            async with session.get(sim.url + "/metrics") as resp:
                assert resp.headers["Content-Type"].startswith("text/plain")
                text = await resp.text()
        types = {f.name: f.type for f in text_string_to_metric_families(text)}
        values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
        for name in ("prompt_tokens", "prompt_seconds", "tokens_predicted", "tokens_predicted_seconds",
                     "n_decode", "prompt_tokens_cached"):
            assert types[f"llamacpp:{name}"] == "counter"  # the parser drops _total from family names
        for name in ("prompt_tokens_seconds", "predicted_tokens_seconds", "requests_processing",
                     "requests_deferred", "n_busy_slots_per_decode"):
            assert types[f"llamacpp:{name}"] == "gauge"
        assert "# TYPE llamacpp:n_tokens_max counter" in text
        assert values["llamacpp:tokens_predicted_total"] == 8
        assert values["llamacpp:n_decode_total"] == 8  # one prompt batch + 7 decode steps
        assert values["llamacpp:n_busy_slots_per_decode"] == 1
        assert values["llamacpp:predicted_tokens_seconds"] > 0
        assert "llamacpp:n_tokens_max " in text
    run(main())


def test_rate_gauges_reset_on_every_scrape_and_counters_move_at_the_end():
    async def main():
        async with await start_simulator(SMOKE, slots=1) as sim, aiohttp.ClientSession() as session:
            request = asyncio.create_task(post(session, sim.url + "/completion",
                                               {"prompt": "x", "n_predict": 200, "ignore_eos": True}))
            during = await metrics_when(session, sim.url, lambda v: v["llamacpp:requests_processing"] == 1)
            assert during["llamacpp:tokens_predicted_total"] == 0  # moves only when a request finishes
            await request
            after = await metrics(session, sim.url)
            again = await metrics(session, sim.url)
            assert after["llamacpp:tokens_predicted_total"] == 200
            assert after["llamacpp:predicted_tokens_seconds"] > 0
            assert again["llamacpp:predicted_tokens_seconds"] == 0  # the window restarted at the last scrape
            assert again["llamacpp:tokens_predicted_total"] == 200
    run(main())


def test_metrics_off_answers_501():
    async def main():
        async with await start_simulator(SMOKE, metrics=False) as sim, aiohttp.ClientSession() as session:
            async with session.get(sim.url + "/metrics") as resp:
                assert resp.status == 501
                assert (await resp.json())["error"]["type"] == "not_supported_error"
    run(main())


def test_every_endpoint_answers_503_while_loading():
    async def main():
        async with await start_simulator(SMOKE, load_seconds=0.3) as sim, aiohttp.ClientSession() as session:
            loading = {"error": {"message": "Loading model", "type": "unavailable_error", "code": 503}}
            for method, path in (("GET", "/health"), ("GET", "/props"), ("GET", "/metrics"),
                                 ("POST", "/completion")):
                async with session.request(method, sim.url + path, json={"prompt": "x"}) as resp:
                    assert resp.status == 503
                    assert await resp.json() == loading
            await asyncio.sleep(0.35)
            async with session.get(sim.url + "/health") as resp:
                assert resp.status == 200
    run(main())


# --- faults ---------------------------------------------------------------------------------------

async def _faulty(spec: str, check) -> None:
    async with await start_simulator(SMOKE, slots=2, faults=FaultConfig.parse([spec])) as sim, \
            aiohttp.ClientSession() as session:
        await check(session, sim.url)


@pytest.mark.parametrize("kind,status,error_type", [
    ("http_500", 500, "server_error"), ("http_503", 503, "unavailable_error"),
    ("http_400", 400, "invalid_request_error")])
def test_status_faults(kind, status, error_type):
    async def check(session, url):
        for body in (PLAIN, STREAM):
            async with session.post(url + "/completion", json=body) as resp:
                assert resp.status == status
                assert (await resp.json())["error"]["type"] == error_type
    run(_faulty(f"{kind}:1", check))


def test_reset_before_headers():
    async def check(session, url):
        with pytest.raises((aiohttp.ClientOSError, aiohttp.ServerDisconnectedError)):
            await session.post(url + "/completion", json=PLAIN)
    run(_faulty("reset_before_headers:1", check))


@pytest.mark.parametrize("kind", ["reset_mid_stream", "truncated_body"])
def test_cut_streams_and_bodies(kind):
    async def check(session, url):
        async with session.post(url + "/completion", json=STREAM) as resp:
            assert resp.status == 200
            received = []
            with pytest.raises(aiohttp.ClientPayloadError):
                async for line in resp.content:
                    received.append(line)
            assert any(line.startswith(b"data: ") for line in received)
            assert not any(b'"stop":true' in line for line in received)
        async with session.post(url + "/completion", json=PLAIN) as resp:
            assert resp.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):
                await resp.read()
    run(_faulty(f"{kind}:1", check))


def test_malformed_json():
    async def check(session, url):
        async with session.post(url + "/completion", json=PLAIN) as resp:
            assert resp.status == 200
            with pytest.raises(ValueError):
                json.loads(await resp.read())
        async with session.post(url + "/completion", json=STREAM) as resp:
            events = await sse_events(resp)
        with pytest.raises(ValueError):
            json.loads(events[0])
        assert json.loads(events[-1])["stop"] is True
    run(_faulty("malformed_json:1", check))


def test_stream_without_final_event():
    async def check(session, url):
        async with session.post(url + "/completion", json=STREAM) as resp:
            events = [json.loads(e) for e in await sse_events(resp)]  # ends cleanly
        assert len(events) == 6 and not any(e["stop"] for e in events)
        async with session.post(url + "/v1/completions", json=STREAM) as resp:
            events = await sse_events(resp)
        assert b"[DONE]" not in events
    run(_faulty("stream_no_final:1", check))


def test_first_byte_stall():
    async def check(session, url):
        started = time.monotonic()
        async with session.post(url + "/completion", json=PLAIN) as resp:
            assert time.monotonic() - started >= 0.3
            assert resp.status == 200 and (await resp.json())["tokens_predicted"] == 6
    run(_faulty("first_byte_stall:0.3", check))


def test_slow_drip():
    async def check(session, url):
        async with session.post(url + "/completion", json=STREAM) as resp:
            arrivals = []
            async for line in resp.content:
                if line.startswith(b"data: "):
                    arrivals.append(time.monotonic())
        assert len(arrivals) == 7
        gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
        assert min(gaps) >= 0.04
    run(_faulty("slow_drip:1:0.05", check))


def test_garbage_metrics():
    async def check(session, url):
        async with session.get(url + "/metrics") as resp:
            assert resp.status == 200
            text = await resp.text()
        with pytest.raises(ValueError):
            list(text_string_to_metric_families(text))
    run(_faulty("garbage_metrics:1", check))


def test_fault_choice_is_seeded_and_shares_hold():
    config = FaultConfig.parse(["http_500:0.25", "first_byte_stall:2:0.25"])
    picks = [config.for_request(7, i) for i in range(2000)]
    assert picks == [config.for_request(7, i) for i in range(2000)]
    assert sum(p is not None and p.kind.value == "http_500" for p in picks) == pytest.approx(500, abs=80)
    assert sum(p is None for p in picks) == pytest.approx(1000, abs=100)
    assert parse_fault("first_byte_stall:2").seconds == 2 and parse_fault("first_byte_stall:2").share == 1
    for bad in ("nope:1", "http_500:2", "http_500:x", "first_byte_stall"):
        with pytest.raises(ValueError):
            parse_fault(bad)
    with pytest.raises(ValueError):
        FaultConfig.parse(["http_500:0.7", "http_503:0.7"])


# --- the command --------------------------------------------------------------------------------

def test_cli_rejects_an_unknown_profile():
    result = CliRunner().invoke(sim_command, ["--profile", "nope"])
    assert result.exit_code == 2
    assert "unknown profile 'nope'" in result.output


def test_cli_serves_until_sigint():
    code = "from loadgen.sim.cli import sim_command; sim_command()"
    with SimProcess("--profile", "smoke", "--slots", "2", command=(sys.executable, "-c", code)) as sim:
        assert sim.url.startswith("http://127.0.0.1:")

        async def ask() -> tuple[int, Any]:
            async with aiohttp.ClientSession() as session:
                return await post(session, sim.url + "/completion", {"prompt": "hi", "n_predict": 3})
        status, body = run(ask())
        assert status == 200 and body["tokens_predicted"] == 3
        assert sim.stop() == 0
