"""--lora-mix without a network: the mix's parsing and cycle, the bodies and what the server says it
applied (client/backends/lora.py), the refusal before the first level (run/lora.py) and the shares
per adapter (analysis/lora.py)."""

from __future__ import annotations

import json

import msgspec
import pytest

from loadgen.analysis.lora import adapter_shares
from loadgen.client.backends import GenerationParams, make_backend
from loadgen.client.backends.lora import LoraBackend
from loadgen.core.errors import EXIT_FAILED, EXIT_USAGE, ConfigError
from loadgen.core.lora_mix import applied_label, lora_field, parse_lora_mix
from loadgen.core.records import RequestRecord, ServerOutcome, make_record
from loadgen.run.lora import lora_refusal


@pytest.mark.parametrize("spec, entries, cycle", [
    ("0:1", (("0", 1),), ("0",)),
    ("0:1,1:1", (("0", 1), ("1", 1)), ("0", "1")),
    ("0:1,1:1,none:1", (("0", 1), ("1", 1), ("none", 1)), ("0", "1", "none")),
    ("0:2,1:1", (("0", 2), ("1", 1)), ("0", "1", "0")),
    ("1:3", (("1", 3),), ("1", "1", "1")),
    (" none:1 , 00:1", (("none", 1), ("0", 1)), ("none", "0")),
    ("0:3,1:1", (("0", 3), ("1", 1)), ("0", "0", "1", "0")),
])
def test_a_mix_parses_and_lays_its_weights_out_in_one_cycle(spec, entries, cycle):
    mix = parse_lora_mix(spec)
    assert mix.entries == entries
    assert mix.cycle == cycle


@pytest.mark.parametrize("spec, says", [
    ("", "is not ID:WEIGHT"),
    ("0", "is not ID:WEIGHT"),
    ("a:1", "is not ID:WEIGHT"),
    ("-1:1", "is not ID:WEIGHT"),
    ("0:1.5", "is not ID:WEIGHT"),
    ("0:0", "weight is 0"),
    ("0:1,0:2", "0 is given twice"),
    ("none:1,none:1", "none is given twice"),
])
def test_a_bad_mix_is_one_line_of_bad_input(spec, says):
    with pytest.raises(ConfigError) as err:
        parse_lora_mix(spec)
    assert says in str(err.value) and err.value.exit_code == EXIT_USAGE


def test_the_lora_field_asks_for_one_adapter_or_for_none_explicitly():
    assert lora_field("1") == [{"id": 1, "scale": 1.0}]
    # `none` is a non-empty list: an empty or missing `lora` means the server's own adapters
    assert lora_field("none") == [{"id": 0, "scale": 0.0}]


@pytest.mark.parametrize("echo, label", [
    ([(1, 1.0)], "1"),
    ([(0, 0.0)], "none"),
    ([], "none"),
    ([(1, 0.5), (0, 1.0)], "0+1"),
    ([(0, 0.0), (1, 1.0)], "1"),
])
def test_what_the_server_applied_is_labelled_by_its_ids_at_a_scale(echo, label):
    assert applied_label(echo) == label


def _llamacpp(mix: str | None, stream: bool = False):
    return make_backend("llamacpp", GenerationParams(prompt="hi", n_predict=4, stream=stream,
                                                     lora_mix=parse_lora_mix(mix) if mix else None))


def test_each_body_carries_the_adapter_of_its_index_and_a_plain_run_none():
    backend = _llamacpp("0:1,1:1,none:1")
    assert isinstance(backend, LoraBackend)
    bodies = [json.loads(backend.build("s", seq)) for seq in range(6)]
    assert [b["lora"] for b in bodies] == [lora_field(x) for x in ("0", "1", "none") * 2]
    assert all(b["prompt"].startswith("[s] ") and b["n_predict"] == 4 for b in bodies)
    assert [backend.lora_label(seq) for seq in range(4)] == ["0", "1", "none", "0"]
    plain = _llamacpp(None)
    assert not isinstance(plain, LoraBackend) and "lora" not in json.loads(plain.build("s", 0))


def test_an_openai_api_body_carries_it_too():
    backend = make_backend("chat", GenerationParams(prompt="hi", lora_mix=parse_lora_mix("1:1")), model="m")
    body = json.loads(backend.build("s", 0))
    assert body["lora"] == [{"id": 1, "scale": 1.0}] and body["messages"]


TIMINGS = {"prompt_n": 3, "prompt_ms": 1.0, "predicted_n": 4, "predicted_ms": 2.0}


def _answer(lora: list[dict] | None, **extra) -> bytes:
    settings = {"n_predict": 4, **({"lora": lora} if lora is not None else {})}
    return json.dumps({"content": "", "stop": True, "tokens_predicted": 4, "timings": TIMINGS,
                       "generation_settings": settings, **extra}).encode()


def test_a_whole_answer_says_which_adapters_applied():
    backend = _llamacpp("0:1,1:1")
    assert backend.parse(200, _answer([{"id": 1, "scale": 1.0}])).lora_applied == "1"
    assert backend.parse(200, _answer([{"id": 0, "scale": 0.0}])).lora_applied == "none"
    assert backend.parse(200, _answer(None)).lora_applied is None  # said nothing
    failed = backend.parse(500, b'{"error": {"message": "boom"}}')
    assert failed.error_kind == "http_500" and failed.lora_applied is None


def test_a_stream_says_it_in_its_final_event():
    backend = _llamacpp("0:1,1:1", stream=True)
    reader = backend.event_reader()
    partial = b'{"index":0,"content":"a","tokens":[1],"stop":false,"id_slot":0}'
    assert reader.events([partial, partial]) == 2
    reader.events([_answer([{"id": 0, "scale": 1.0}])])
    outcome = reader.finish()
    assert outcome.error_kind is None and outcome.predicted_n == 4 and outcome.lora_applied == "0"
    fresh = backend.event_reader()  # the wrapped reader's fast path stays
    assert fresh.count_region(b"data: " + partial + b"\n\n") == (1, 1)


def test_a_record_keeps_the_adapter_asked_and_the_one_applied():
    record = make_record("t", 4, 0, 7, "s", 0, 10, 200, ServerOutcome(lora_applied="1"), lora="1")
    back = RequestRecord.from_dict(json.loads(msgspec.json.encode(record)))
    assert (back.lora, back.lora_applied) == ("1", "1")
    plain = make_record("t", 4, 0, 7, "s", 0, 10, 200, ServerOutcome())
    assert plain.lora is None and plain.lora_applied is None


ADAPTERS = json.dumps([{"id": 0, "path": "a.gguf", "scale": 1.0}, {"id": 1, "path": "b.gguf", "scale": 1.0}]).encode()


@pytest.mark.parametrize("mix, status, body, exit_code, says", [
    ("0:1,1:1", 200, ADAPTERS, None, None),
    ("none:1,1:1", 200, ADAPTERS, None, None),
    ("0:1,2:1", 200, ADAPTERS, EXIT_USAGE, "asks for adapter 2, but srv has 2 (ids 0-1"),
    ("3:1,5:1", 200, ADAPTERS, EXIT_USAGE, "asks for adapter 3, 5"),
    ("1:1", 200, ADAPTERS[:ADAPTERS.index(b", {")] + b"]", EXIT_USAGE, "has 1 (id 0"),
    ("0:1", 200, b"[]", EXIT_FAILED, "has no LoRA adapters loaded"),
    ("none:1", 200, b"[]", EXIT_FAILED, "has no LoRA adapters loaded"),
    ("0:1", 404, b"not found", EXIT_FAILED, "did not list adapters (HTTP 404)"),
    ("0:1", 200, b"{}", EXIT_FAILED, "did not list adapters"),
    ("0:1", 0, b"connection refused", EXIT_FAILED, "(connection refused)"),
])
def test_the_refusal_before_the_first_level(mix, status, body, exit_code, says):
    refusal = lora_refusal(parse_lora_mix(mix), "srv", status, body)
    if exit_code is None:
        assert refusal is None
        return
    assert refusal is not None and refusal.exit_code == exit_code and says in str(refusal)
    assert "\n" not in str(refusal)


def _rec(seq: int, lora: str, applied: str | None, error: str | None = None, level: int = 4) -> RequestRecord:
    outcome = ServerOutcome(error_kind=error, predicted_n=None if error else 8, lora_applied=applied)
    return make_record("t", level, 0, seq, "s", seq * 10, seq * 10 + 2_000_000, 200, outcome, lora=lora)


def test_shares_per_adapter_per_level_with_what_the_server_applied():
    records = [_rec(0, "0", "0"), _rec(1, "1", "1"), _rec(2, "0", "0"), _rec(3, "1", "none"),
               _rec(4, "0", None, "http_500"), _rec(5, "1", None, "cancelled"), _rec(6, "0", "0", level=8)]
    four, eight = adapter_shares(records)
    assert (four.level, eight.level) == (4, 8)
    zero, one = four.adapters
    assert (zero.adapter, zero.requests, zero.ok, zero.output_tokens, zero.told, zero.mismatched) == ("0", 3, 2, 16, 2, [])
    assert (one.adapter, one.requests, one.ok, one.told, one.mismatched) == ("1", 2, 2, 2, [3])  # cancelled left out
    assert four.share(zero) == pytest.approx(0.6) and zero.latency_p50_ms == pytest.approx(2.0)
    assert adapter_shares([make_record("t", 4, 0, 0, "s", 0, 1, 200, ServerOutcome())]) == []


@pytest.mark.parametrize("args, says", [
    (("--lora-mix", "0:x"), "'0:x' is not ID:WEIGHT"),
    (("--lora-mix", "0:1", "--workers", "2"), "--lora-mix runs a level's requests in this process"),
])
def test_the_command_line_refuses_a_bad_mix_before_any_request(args, says):
    import subprocess

    from servers import LOADGEN

    proc = subprocess.run([*LOADGEN, "sweep", "--ports", "1", *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == EXIT_USAGE and says in proc.stderr, proc.stderr
