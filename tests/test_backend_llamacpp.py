"""The llama.cpp backend builds salted, uncached requests and reads responses without a network."""

from __future__ import annotations

import json
import re

from loadgen.client.backends import GenerationParams
from loadgen.client.backends.llamacpp import LlamaCppBackend
from loadgen.core import records

BODY = {"content": "x", "id_slot": 2, "stop": True, "tokens_predicted": 16, "stop_type": "limit",
        "timings": {"cache_n": 0, "prompt_n": 23, "prompt_ms": 12.5, "predicted_n": 16, "predicted_ms": 80.0,
                    "predicted_per_second": 187.5, "prompt_per_second": 1840.0}}


def backend(**kw) -> LlamaCppBackend:
    return LlamaCppBackend(GenerationParams(prompt="Hello \"world\" ü", **kw))


def test_request_is_salted_uncached_and_carries_generation_params():
    body = json.loads(backend(n_predict=32, temperature=0.0, seed=7).build("abc-123"))
    assert body["prompt"] == '[abc-123] Hello "world" ü'
    assert body["cache_prompt"] is False
    assert (body["n_predict"], body["temperature"], body["ignore_eos"], body["seed"]) == (32, 0.0, True, 7)


def test_seed_is_omitted_unless_given():
    assert "seed" not in json.loads(backend().build("s"))


def test_parse_reads_timings_with_llama_server_names():
    o = backend().parse(200, json.dumps(BODY).encode())
    assert o.error_kind is None
    assert (o.prompt_n, o.prompt_ms, o.predicted_n, o.predicted_ms, o.predicted_per_second, o.cache_n) == (
        23, 12.5, 16, 80.0, 187.5, 0)
    assert (o.tokens_predicted, o.stop_type, o.id_slot) == (16, "limit", 2)


def test_parse_null_speed_becomes_none():
    body = {**BODY, "timings": {**BODY["timings"], "predicted_per_second": None}}
    assert backend().parse(200, json.dumps(body).encode()).predicted_per_second is None


def test_http_error_keeps_status_kind_and_server_message():
    err = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
    o = backend().parse(503, json.dumps(err).encode())
    assert (o.error_kind, o.error_message) == ("http_503", "Loading model")


def test_non_json_bodies_are_invalid_json_or_http_errors():
    assert backend().parse(200, b"{not json").error_kind == records.INVALID_JSON
    assert backend().parse(200, b"[1,2]").error_kind == records.INVALID_JSON
    assert backend().parse(500, b"<html>oops</html>").error_kind == "http_500"


def test_ok_status_without_timings_is_invalid():
    assert backend().parse(200, b'{"content": "x"}').error_kind == records.INVALID_JSON


def test_error_object_in_a_200_is_a_server_error():
    o = backend().parse(200, b'{"error": {"message": "Context size has been exceeded."}}')
    assert (o.error_kind, o.error_message) == (records.SERVER_ERROR, "Context size has been exceeded.")


def test_salts_are_distinct_strings_of_sixteen_digits():
    from loadgen.run.salts import new_salt

    salts = [new_salt() for _ in range(20000)]
    assert len(set(salts)) == len(salts)
    assert all(re.fullmatch(r"\d{16}", s) for s in salts)


def test_a_forked_child_makes_other_salts_than_its_parent():
    import os

    from loadgen.run.salts import new_salt

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next salt, then out at once
        os.write(write, new_salt().encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(read, 100).decode()
    os.close(read)
    os.close(write)
    assert len(child) == 16 and child != new_salt()
