"""Structured output and tools against the real llama-server test bed (build 11434, `--jinja`).

A schema-constrained sweep reports its validity share (the grammar the server builds from the
schema makes it ~1 for the answers that finish) and its tokens still equal the server's counter; a
0/10/50-tool ladder shows the prompt, and with it TTFT, growing with the tool count; bad feature
input is refused before the first level (docs/request-features.md).

SmolLM2's own chat template ignores `tools`; the server here gets a ChatML template that lists
them in a system message (written by the fixture), as a tool-calling model's template does.
"""

from __future__ import annotations

import json

import pytest

from loadgen.core import records
from loadgen.results.reader import load_records, load_run_dict
from servers import start_llama_server, sweep

pytestmark = pytest.mark.real

SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
TOOLS_TEMPLATE = """{%- if tools %}<|im_start|>system
You may call these tools:
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
To call one, answer <tool_call>{"name": NAME, "arguments": {...}}</tool_call><|im_end|>
{% endif %}
{%- for message in messages %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}
"""


@pytest.fixture(scope="module")
def jinja_server(tmp_path_factory):
    logs = tmp_path_factory.mktemp("structured-logs")
    template = logs / "tools.jinja"
    template.write_text(TOOLS_TEMPLATE)
    # 4,096 tokens a slot: 50 synthetic tools take ~3,000
    server = start_llama_server("structured", 2, logs, extra=("--jinja", "--chat-template-file", str(template),
                                                              "-c", "8192"))
    yield server
    server.stop()


def _levels(out):
    return load_run_dict(out)["targets"][0]["levels"]


def _tokens_match_the_server(out) -> None:
    """Σ output tokens of every record the server answered (judged broken or not) per level equals
    its `llamacpp:tokens_predicted_total` increase; the level's own count leaves the broken out."""
    by_level: dict = {}
    for r in load_records(out):
        by_level.setdefault(r.level, []).append(r)
    for level in _levels(out):
        recs = by_level[level["level"]]
        predicted = level["server_metrics_delta"]["llamacpp:tokens_predicted_total"]
        assert sum(r.output_tokens or 0 for r in recs) == predicted, level
        broken = sum(r.output_tokens or 0 for r in recs if r.error_kind == records.INVALID_OUTPUT)
        assert level["output_tokens"] + broken == predicted, level


def test_a_schema_sweep_reports_its_validity_share(jinja_server, tmp_path):
    out = tmp_path / "run"
    proc = sweep("--url", jinja_server.url, "--stream", "--concurrency", "1,2", "--requests", "6", "--n-predict", "64",
                 "--warmup", "1", "--json-schema", json.dumps(SCHEMA), "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "valid" in proc.stdout  # the table's validity column
    assert load_run_dict(out)["config"]["json_schema"] == SCHEMA
    assert load_run_dict(out)["config"]["ignore_eos"] is False
    for r in load_records(out):
        assert r.error_kind in (None, records.INVALID_OUTPUT), r.error_message
        if r.stop_type == "limit":
            assert r.output_valid is None  # cut at n_predict: not judged
        else:
            assert r.output_valid is not None and r.output_tokens < 64
    for level in _levels(out):
        valid = level["metrics"]["output_valid"]
        assert valid["count"] >= 1 and valid["mean"] >= 0.9, level  # the server's grammar holds the schema
    _tokens_match_the_server(out)


def test_the_chat_api_sends_the_schema_as_response_format(jinja_server, tmp_path):
    out = tmp_path / "run"
    proc = sweep("--url", jinja_server.url, "--api", "chat", "--concurrency", "2", "--requests", "4",
                 "--n-predict", "64", "--warmup", "0", "--json-schema", json.dumps(SCHEMA), "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    judged = [r for r in load_records(out) if r.output_valid is not None]
    assert judged and all(r.output_valid for r in judged), [r.error_message for r in load_records(out)]
    _tokens_match_the_server(out)


def test_a_grammar_constrains_every_answer_and_each_counts_valid(jinja_server, tmp_path):
    grammar = tmp_path / "yes-no.gbnf"
    grammar.write_text('root ::= "yes" | "no"\n')
    out = tmp_path / "run"
    proc = sweep("--url", jinja_server.url, "--concurrency", "2", "--requests", "4", "--n-predict", "8",
                 "--warmup", "0", "--grammar", str(grammar), "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    recs = load_records(out)
    # "yes" or "no" then the end the grammar forces: up to 3 tokens as SmolLM2 may spell them ("n", "o",
    # and its end-of-text) — never the 8 of --n-predict an unconstrained answer takes
    odd = [(r.level, r.seq, r.error_kind, r.error_message, r.output_valid, r.output_tokens, r.stop_type)
           for r in recs if not (r.ok and r.output_valid and r.output_tokens <= 3)]
    assert odd == [], odd
    assert _levels(out)[0]["metrics"]["output_valid"] == pytest.approx(
        {"count": 4, "mean": 1.0, "p50": 1.0, "p90": 1.0, "p99": 1.0, "max": 1.0})
    _tokens_match_the_server(out)


def test_a_tool_ladder_shows_the_prompt_and_ttft_growing(jinja_server, tmp_path):
    rungs = {}
    for n in (0, 10, 50):
        out = tmp_path / f"tools-{n}"
        proc = sweep("--url", jinja_server.url, "--api", "chat", "--stream", "--tools", str(n), "--concurrency", "1",
                     "--requests", "1", "--n-predict", "4", "--warmup", "0", "--output", str(out))
        assert proc.returncode == 0, proc.stderr
        level = _levels(out)[0]
        assert level["requests_ok"] == 1, level["errors_by_kind"]
        rungs[n] = (level["prompt_n"]["p50"], level["ttft_ms"]["p50"])
        if n:
            assert level["metrics"]["tool_calls"] >= 0 and load_run_dict(out)["config"]["tools"] == n
        _tokens_match_the_server(out)
    (p0, t0), (p10, t10), (p50, t50) = rungs[0], rungs[10], rungs[50]
    assert p0 < p10 < p50 and p50 - p0 > 40 * 20, rungs  # tens of tokens a tool
    assert t0 < t10 < t50, rungs


@pytest.mark.parametrize(("args", "message"), [
    (("--api", "completions", "--tools", "10"), "the completions API has no tools"),
    (("--json-schema", '{"type": "objekt"}'), "--json-schema: not a valid JSON schema"),
    (("--json-schema", '{"type": '), "--json-schema: not JSON"),
])
def test_bad_feature_input_is_refused_before_the_first_level(jinja_server, tmp_path, args, message):
    out = tmp_path / "run"
    proc = sweep("--url", jinja_server.url, *args, "--output", str(out), timeout=60)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not out.exists()


def test_a_duplicate_tool_name_is_refused(jinja_server, tmp_path):
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
    path = tmp_path / "tools.json"
    path.write_text(json.dumps([tool, tool]))
    proc = sweep("--url", jinja_server.url, "--api", "chat", "--tools", str(path), "--output", str(tmp_path / "r"),
                 timeout=60)
    assert proc.returncode == 2 and "two tools are named 'lookup'" in proc.stderr, proc.stderr
