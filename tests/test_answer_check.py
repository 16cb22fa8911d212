"""The rule that judges a constrained answer (core/answer_check.py), the body fields of each API
(client/backends/features.py), the backends' judged outcomes, and the options' refusals
(cli/request_features.py). No network."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from loadgen.cli.request_features import read_tools, request_features, synthetic_tools
from loadgen.client.backends import GenerationParams, make_backend
from loadgen.core import records
from loadgen.core.answer_check import AnswerCheck, ToolCall
from loadgen.core.errors import ConfigError

SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
TOOLS = {"get_weather": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
         "no_params": {}}

# (check, answer text, tool calls, stop) -> expected: True valid, None not judged, else a fragment of the reason.
# Written down before the rule was run.
CASES = [
    (AnswerCheck(schema=SCHEMA), '{"answer": "4"}', [], "eos", True),
    (AnswerCheck(schema=SCHEMA), '{\n  "answer": "four"\n}', [], "stop", True),
    (AnswerCheck(schema=SCHEMA), '{"answer": 4}', [], "eos", "no match for the schema at answer"),
    (AnswerCheck(schema=SCHEMA), '{"reply": "4"}', [], "eos", "no match for the schema at top level"),
    (AnswerCheck(schema=SCHEMA), '{"answer": "4"', [], "eos", "not JSON"),
    (AnswerCheck(schema=SCHEMA), '', [], "eos", "not JSON"),
    (AnswerCheck(schema=SCHEMA), '{"answer": "4', [], "limit", None),  # cut at n_predict: not judged
    (AnswerCheck(schema=SCHEMA), '{"answer": "4', [], "length", None),  # the OpenAI spelling
    (AnswerCheck(schema={}), '[1, 2]', [], "eos", True),  # the empty schema takes any JSON
    (AnswerCheck(grammar=True), 'yes', [], "eos", True),  # the server enforces a grammar
    (AnswerCheck(grammar=True), '', [], "eos", "empty"),
    (AnswerCheck(), 'anything', [], "eos", None),  # nothing asked: nothing judged
    (AnswerCheck(tools=TOOLS), 'plain words', [], "stop", None),  # no tool call: not judged
    (AnswerCheck(tools=TOOLS), '', [ToolCall("get_weather", '{"city": "Paris"}')], "tool_calls", True),
    (AnswerCheck(tools=TOOLS), '', [ToolCall("no_params", '{}')], "tool_calls", True),
    (AnswerCheck(tools=TOOLS), '', [ToolCall("get_weather", '{"city": 7}')], "tool_calls",
     "get_weather's arguments: no match for the schema at city"),
    (AnswerCheck(tools=TOOLS), '', [ToolCall("get_weather", '{"city": "Par')], "tool_calls", "not JSON"),
    (AnswerCheck(tools=TOOLS), '', [ToolCall("get_weather", '{"city": "A"}'), ToolCall("nope", "{}")],
     "tool_calls", "names no offered tool: 'nope'"),
    (AnswerCheck(tools=TOOLS), '', [ToolCall("get_weather", '{"city": "A"}')], "length", None),
]


@pytest.mark.parametrize(("check", "text", "calls", "stop", "expected"), CASES)
def test_the_validity_rule(check, text, calls, stop, expected):
    verdict = check.judge(text, calls, stop)
    if expected is True or expected is None:
        assert verdict is expected
    else:
        assert isinstance(verdict, str) and expected in verdict, verdict


def _body(api: str, **features) -> dict:
    params = GenerationParams(prompt="hi", **features)
    return json.loads(make_backend(api, params, model=None if api == "llamacpp" else "m").build("ab12", 0))


def test_each_api_carries_the_schema_under_its_own_field():
    assert _body("llamacpp", json_schema=SCHEMA)["json_schema"] == SCHEMA
    assert _body("completions", json_schema=SCHEMA)["json_schema"] == SCHEMA  # llama-server ignores response_format there
    chat = _body("chat", json_schema=SCHEMA)
    assert chat["response_format"] == {"type": "json_schema", "json_schema": {"name": "loadgen", "schema": SCHEMA}}
    assert "json_schema" not in chat
    for api in ("llamacpp", "completions", "chat"):
        assert _body(api, grammar='root ::= "yes"')["grammar"] == 'root ::= "yes"'
    tools = synthetic_tools(3)
    chat = _body("chat", tools=tools, tool_choice="tool_001")
    assert chat["tools"] == list(tools)
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "tool_001"}}
    assert _body("chat", tools=tools, tool_choice="required")["tool_choice"] == "required"
    plain = _body("chat")
    assert not {"response_format", "grammar", "tools", "tool_choice"} & plain.keys()


def test_bodies_stay_salted_per_request_with_the_schema_serialised_once():
    backend = make_backend("llamacpp", GenerationParams(prompt="hi", json_schema=SCHEMA))
    a, b = backend.build("aaaa"), backend.build("bbbb")
    assert a.replace(b"aaaa", b"bbbb") == b and json.loads(a)["prompt"] == "[aaaa] hi"


def test_a_plain_backend_keeps_its_own_methods_and_a_checked_one_judges():
    plain = make_backend("llamacpp", GenerationParams(prompt="hi"))
    assert plain.parse.__func__ is type(plain).parse  # type: ignore[attr-defined]  # the plain path is untouched
    checked = make_backend("llamacpp", GenerationParams(prompt="hi", json_schema=SCHEMA))
    body = b'{"content":"{\\"answer\\":3}","stop_type":"eos","tokens_predicted":5,"timings":{"predicted_n":5}}'
    outcome = checked.parse(200, body)
    assert outcome.error_kind == records.INVALID_OUTPUT and outcome.output_valid is False
    assert outcome.predicted_n == 5  # the server's work is kept: its tokens still count
    assert plain.parse(200, body).output_valid is None


def _chunk(**delta) -> bytes:
    return msgspec.json.encode({"choices": [{"delta": delta, "finish_reason": None}]})


def test_a_streamed_tool_call_is_joined_from_its_pieces_and_judged():
    tools = ({"type": "function", "function": {"name": "get_weather", "parameters": TOOLS["get_weather"]}},)
    backend = make_backend("chat", GenerationParams(prompt="hi", stream=True, tools=tools), model="m")
    reader = backend.event_reader()
    piece = {"index": 0, "function": {"name": "get_weather", "arguments": '{"city"'}}
    reader.events([_chunk(tool_calls=[piece]),
                   _chunk(tool_calls=[{"index": 0, "function": {"arguments": ': "Oslo"}'}}]),
                   b'{"choices":[{"delta":{},"finish_reason":"tool_calls"}],"usage":{"completion_tokens":9}}',
                   b"[DONE]"])
    outcome = reader.finish()
    assert outcome.error_kind is None and outcome.output_valid is True and outcome.tool_calls == 1
    reader = backend.event_reader()
    reader.events([_chunk(content="no tools today"),
                   b'{"choices":[{"delta":{},"finish_reason":"stop"}]}', b"[DONE]"])
    outcome = reader.finish()
    assert outcome.output_valid is None and outcome.tool_calls == 0


def test_a_streamed_schema_answer_is_judged_from_its_content_events():
    backend = make_backend("llamacpp", GenerationParams(prompt="hi", stream=True, json_schema=SCHEMA))
    reader = backend.event_reader()
    assert reader.count_region(b'data: {"content":"x","stop":false}\n\n') is None  # every event read
    content = reader.events([b'{"content":"{\\"answer\\"","stop":false}', b'{"content":":\\"y\\"}","stop":false}',
                             b'{"content":"","stop":true,"stop_type":"eos","timings":{"predicted_n":4}}'])
    assert content == 2
    assert reader.finish().output_valid is True


def _write(tmp_path, name, data) -> str:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def test_tool_files_and_schemas_that_cannot_be_used_are_refused(tmp_path):
    tool = {"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}}
    with pytest.raises(ConfigError, match="two tools are named 'a'"):
        read_tools(_write(tmp_path, "dup.json", [tool, tool]))
    bad = {"type": "function", "function": {"name": "b", "parameters": {"type": "objekt"}}}
    with pytest.raises(ConfigError, match="tool 'b'.s parameters: not a valid JSON schema"):
        read_tools(_write(tmp_path, "bad.json", [bad]))
    with pytest.raises(ConfigError, match="not a valid JSON schema"):
        request_features('{"type": 5}', None, None, None, "llamacpp")
    with pytest.raises(ConfigError, match="not JSON"):
        request_features('{"type": ', None, None, None, "llamacpp")
    with pytest.raises(ConfigError, match="the completions API has no tools"):
        request_features(None, None, "10", None, "completions")
    with pytest.raises(ConfigError, match="the messages API has no field"):
        request_features(_write(tmp_path, "s.json", SCHEMA), None, None, None, "messages")
    with pytest.raises(ConfigError, match="not both"):
        request_features('{"type": "object"}', _write(tmp_path, "g.gbnf", 'root ::= "a"'), None, None, "llamacpp")
    with pytest.raises(ConfigError, match="give auto, required, none or an offered tool's name"):
        request_features(None, None, "2", "tool_009", "chat")
    fields = request_features(None, None, "2", "tool_001", "chat")
    assert [t["function"]["name"] for t in fields["tools"]] == ["tool_000", "tool_001"]
    assert fields["ignore_eos"] is False and request_features(None, None, None, None, "chat") == {"ignore_eos": True}


def test_synthetic_tools_are_distinct_and_the_same_every_time():
    tools = synthetic_tools(50)
    assert len({t["function"]["name"] for t in tools}) == 50 and tools == synthetic_tools(50)


def test_sweep_refuses_a_duplicate_tool_in_one_line_before_any_request(tmp_path):
    tool = {"type": "function", "function": {"name": "a"}}
    result = subprocess.run([sys.executable, "-m", "loadgen", "sweep", "--url", "http://127.0.0.1:9", "--api", "chat",
                             "--model", "m", "--tools", _write(tmp_path, "t.json", [tool, tool]), "--output",
                             str(tmp_path / "out")], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")})
    assert result.returncode == 2, result.stderr
    assert "two tools are named 'a'" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_the_simulator_prefills_the_offered_tools(tmp_path):
    """`loadgen sim` renders offered tools into the chat prompt, so a tool ladder costs prefill there too."""
    from loadgen.results.reader import load_run_dict
    from servers import SimThread, sweep

    prompts = {}
    with SimThread() as sim:
        for n in (0, 20):
            out = tmp_path / f"tools-{n}"
            proc = sweep("--url", sim.url, "--api", "chat", "--tools", str(n), "--concurrency", "1", "--requests", "2",
                         "--n-predict", "4", "--warmup", "0", "--output", str(out))
            assert proc.returncode == 0, proc.stderr
            prompts[n] = load_run_dict(out)["targets"][0]["levels"][0]["prompt_n"]["p50"]
    assert prompts[20] > prompts[0] + 20 * 20, prompts


def test_the_verdict_fields_survive_the_parquet_records_format(tmp_path):
    pytest.importorskip("pyarrow")
    from loadgen.core import columnar
    from loadgen.core.records import RequestRecord, ServerOutcome, make_record

    recs = [make_record("t", 1, 0, i, "s", 1, 2, 200, ServerOutcome(output_valid=(True, False, None)[i % 3],
                                                                    tool_calls=i)) for i in range(6)]
    columnar.write_records(tmp_path / "r.parquet", recs)
    assert [RequestRecord.from_dict(x) for x in columnar.read_records(tmp_path / "r.parquet")] == recs


def test_the_simulator_charges_a_constrained_request_its_grammar_cost(tmp_path):
    """A profile's grammar_ms_per_token: each decode step of a request with a grammar costs that
    much more, so the same load with --grammar decodes slower there, as on a real server."""
    from loadgen.results.reader import load_run_dict
    from servers import SimThread, sweep

    profile = tmp_path / "grammar.toml"
    profile.write_text('name = "g"\nmodel_alias = "g-sim"\nprefill_tok_s = 50000.0\nstep_ms = 2.0\nalpha = 0.0\n'
                       'n_ctx = 2048\neos_probability = 0.0\ngrammar_ms_per_token = 6.0\n')
    grammar = tmp_path / "any.gbnf"
    grammar.write_text('root ::= [a-z]+\n')
    rates = {}
    with SimThread(str(profile), time_scale=1.0, slots=1) as sim:
        for name, extra in (("plain", ("--no-ignore-eos",)), ("grammar", ("--grammar", str(grammar)))):
            out = tmp_path / name
            proc = sweep("--url", sim.url, "--concurrency", "1", "--requests", "3", "--n-predict", "16",
                         "--warmup", "0", *extra, "--output", str(out))
            assert proc.returncode == 0, proc.stderr
            rates[name] = load_run_dict(out)["targets"][0]["levels"][0]["decode_tok_s_mean"]
    assert 3 < rates["plain"] / rates["grammar"] < 5, rates  # 2 ms a step against 8
