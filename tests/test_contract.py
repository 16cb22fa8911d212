"""One set of assertions, run against the simulator and the real test-bed llama-server.

If a llama.cpp upgrade grows or drops a field the simulator (and loadgen's backends) rely on, the
real-server half of this test names the field.
"""

from __future__ import annotations

import json
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from servers import SimProcess

COMPLETION_KEYS = {"index", "content", "tokens", "id_slot", "stop", "model", "tokens_predicted", "tokens_evaluated",
                   "generation_settings", "prompt", "has_new_line", "truncated", "stop_type", "stopping_word",
                   "tokens_cached", "timings"}
TIMINGS_KEYS = {"cache_n", "prompt_n", "prompt_ms", "prompt_per_second", "predicted_n", "predicted_ms",
                "predicted_per_token_ms", "predicted_per_second"}
METRIC_NAMES = {"llamacpp:prompt_tokens_total", "llamacpp:prompt_seconds_total", "llamacpp:tokens_predicted_total",
                "llamacpp:tokens_predicted_seconds_total", "llamacpp:n_decode_total", "llamacpp:requests_processing",
                "llamacpp:requests_deferred", "llamacpp:prompt_tokens_seconds", "llamacpp:predicted_tokens_seconds"}
BODY = {"prompt": "[contract] Say hello.", "n_predict": 4, "ignore_eos": True, "cache_prompt": False}


@pytest.fixture(scope="module")
def simulator():
    with SimProcess("--profile", "smoke", "--slots", "4", "--time-scale", "0.2") as sim:
        yield sim.url


@pytest.fixture(params=["simulator", pytest.param("real", marks=pytest.mark.real)])
def server_url(request):
    if request.param == "simulator":
        return request.getfixturevalue("simulator")
    four, _ = request.getfixturevalue("real_servers")
    return four.url


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def post(url: str, body: dict) -> bytes:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.status == 200
        return resp.read()


def keys_differ(expected: set[str], got: dict) -> str:
    missing, extra = expected - got.keys(), got.keys() - expected
    return f"missing {sorted(missing)}, new {sorted(extra)}"


def test_completion_non_stream_shape(server_url):
    data = json.loads(post(server_url + "/completion", BODY))
    assert data.keys() == COMPLETION_KEYS, keys_differ(COMPLETION_KEYS, data)
    assert data["timings"].keys() >= TIMINGS_KEYS, keys_differ(TIMINGS_KEYS, data["timings"])
    assert data["stop_type"] == "limit" and data["tokens_predicted"] == 4
    t = data["timings"]
    assert t["predicted_n"] == 4 and t["cache_n"] == 0 and t["prompt_n"] >= 1
    assert isinstance(t["prompt_ms"], float) and isinstance(t["predicted_ms"], float)
    assert isinstance(data["id_slot"], int)


def test_completion_stream_ends_with_a_final_object_and_no_done(server_url):
    raw = post(server_url + "/completion", {**BODY, "stream": True}).decode()
    events = [e for e in raw.split("\n\n") if e.strip()]
    assert all(e.startswith("data: ") for e in events)
    assert "[DONE]" not in raw
    payloads = [json.loads(e[len("data: "):]) for e in events]
    assert all(p["stop"] is False for p in payloads[:-1])
    final = payloads[-1]
    assert final["stop"] is True and final["timings"]["predicted_n"] == 4
    assert final.keys() >= COMPLETION_KEYS - {"tokens"}, keys_differ(COMPLETION_KEYS, final)


def test_openai_completions_and_chat_carry_usage_and_timings(server_url):
    comp = json.loads(post(server_url + "/v1/completions", {**BODY, "max_tokens": 4}))
    assert comp["usage"]["completion_tokens"] == 4 and "timings" in comp
    assert comp["choices"][0]["finish_reason"] == "length"
    chat = json.loads(post(server_url + "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "[contract] hi"}], "max_tokens": 4, "ignore_eos": True,
        "cache_prompt": False}))
    assert chat["choices"][0]["message"]["role"] == "assistant"
    assert chat["usage"]["completion_tokens"] == 4 and chat["timings"]["predicted_n"] == 4
    stream = post(server_url + "/v1/completions", {**BODY, "max_tokens": 4, "stream": True}).decode()
    assert stream.rstrip().endswith("data: [DONE]")


def test_props_slots_and_metrics(server_url):
    status, body = get(server_url + "/props")
    props = json.loads(body)
    assert status == 200 and props["total_slots"] == 4
    assert isinstance(props["default_generation_settings"]["n_ctx"], int)
    assert isinstance(props["model_alias"], str) and "build_info" in props
    status, body = get(server_url + "/slots")
    slots = json.loads(body)
    assert status == 200 and len(slots) == 4
    assert all({"id", "n_ctx", "is_processing"} <= s.keys() for s in slots)
    status, body = get(server_url + "/metrics")
    names = {s.name for f in text_string_to_metric_families(body.decode()) for s in f.samples}
    assert status == 200 and names >= METRIC_NAMES, f"missing {sorted(METRIC_NAMES - names)}"
    status, body = get(server_url + "/health")
    assert status == 200 and json.loads(body)["status"] == "ok"


def test_errors_have_the_same_shape(server_url):
    req = urllib.request.Request(server_url + "/completion", data=b'{"n_predict": 1}',
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req, timeout=30)
    assert exc.value.code == 400
    err = json.loads(exc.value.read())["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == 400 and err["message"]
