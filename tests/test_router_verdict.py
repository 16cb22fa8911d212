"""The router's per-model figures and thrash verdict (analysis/router.py), on tables written first;
--models parsing and the model each body names (core/model_mix.py, client/backends/router.py)."""

from __future__ import annotations

import json

import msgspec
import pytest

from loadgen.analysis.router import failure_kind, model_figures, thrash_verdict
from loadgen.client.backends import GenerationParams, make_backend
from loadgen.core.errors import ConfigError
from loadgen.core.model_mix import MODEL_UNLOADED, ModelEvent, ModelMix, parse_model_mix
from loadgen.core.records import RequestRecord, ServerOutcome, make_record
from loadgen.core.rundoc import RunDocument

# (models, models_max, requests, waited, loads) → thrash?, words the line must hold
VERDICTS = [
    ((3, 2, 60, 20, 22), True, ["3 models on --models-max 2", "33% of requests waited", "affinity",
                                "--models-max 3"]),
    ((3, 3, 60, 3, 3), False, ["no thrash", "3 loads of 3 models"]),  # each model loaded once
    ((2, 2, 40, 2, 2), False, ["no thrash"]),
    ((3, 2, 100, 3, 4), False, ["no thrash", "3% of requests"]),  # one reload: below 5%
    ((3, 2, 100, 5, 5), True, ["5% of requests waited"]),  # at the 5% line
    # the router holds every model: reloads come from unloads (by hand, sleep, a crash), not the cap
    ((1, 1, 10, 10, 10), False, ["1 model on --models-max 1", "reloaded", "not thrash"]),
    ((3, 3, 60, 20, 22), False, ["reloaded"]),
    ((3, None, 60, 20, 22), True, ["--models-max ?"]),
]


@pytest.mark.parametrize(("args", "thrash", "words"), VERDICTS)
def test_thrash_verdict(args: tuple, thrash: bool, words: list[str]) -> None:
    verdict = thrash_verdict(*args)
    assert verdict is not None
    assert verdict.thrash is thrash
    for word in words:
        assert word in verdict.line


def test_no_requests_no_verdict() -> None:
    assert thrash_verdict(3, 2, 0, 0, 0) is None


def _record(seq: int, model: str, send_ms: int, first_ms: int, done_ms: int, *, status: int = 200,
            error: str | None = None, out: int = 8, prompt_ms: float | None = None) -> RequestRecord:
    outcome = ServerOutcome(error_kind=error, predicted_n=None if error else out, prompt_n=None if error else 30,
                            prompt_ms=prompt_ms)
    ms = 1_000_000
    return make_record("t", 1, 0, seq, "s", send_ms * ms, done_ms * ms, status, outcome, None, None,
                       first_ms * ms, done_ms * ms, None, 1, None, None, None, None, None, None, None, model)


def _ev(ms: int, model: str, status: str) -> ModelEvent:
    return ModelEvent(ms * 1_000_000, model, status)


def test_model_figures_split_cold_load_from_warm_ttft() -> None:
    events = [_ev(0, "a", "loading"), _ev(300, "a", "loaded"), _ev(1000, "a", "unloaded"),
              _ev(1100, "a", "loading"), _ev(1350, "a", "loaded")]
    records = [
        _record(0, "a", 0, 320, 400),  # waited for the first load: TTFT 320, warm median 20 → 300
        _record(1, "a", 500, 520, 600),  # warm: TTFT 20
        _record(2, "a", 700, 720, 800),  # warm: TTFT 20
        _record(3, "a", 900, 900, 1050, status=200, error="incomplete"),  # cut by the unload at 1000
        _record(4, "a", 1100, 1370, 1400, prompt_ms=30.0),  # waited for the reload: 270 less its prefill 30
        _record(5, "b", 0, 10, 20, status=500, error="http_error"),  # a plain failure
    ]
    a, b = model_figures(records, events)
    assert (a.model, a.requests, a.ok, a.waited, a.loads, a.unloads) == ("a", 5, 4, 2, 2, 1)
    assert a.cold_load_ms == [300.0, 240.0]
    assert a.load_ms == [300.0, 250.0]
    assert a.failures == {MODEL_UNLOADED: 1}
    assert (a.output_tokens, a.prompt_tokens) == (32, 120)
    assert b.failures == {"http_error": 1} and b.failed == 1 and b.loads == 0


# (error kind, status, send ms, end ms, the model's changes) → failure kind; the router cut at 754 ms
# and reloaded at 10,756 ms on the test bed (its instance waits up to 10 s for requests in flight)
FAILURES = [
    ("model_unloaded", 500, 0, 10_749, [], "model_unloaded"),  # the router's "proxy error" 500
    ("truncated_stream", 200, 7, 754, [(0, "loaded"), (10_756, "loading")], "model_unloaded"),
    ("truncated_stream", 200, 7, 754, [(0, "loaded"), (400, "unloaded")], "model_unloaded"),  # seen unloaded
    ("truncated_stream", 200, 7, 754, [(0, "loaded")], "truncated_stream"),  # the instance lives on
    ("http_500", 500, 7, 754, [(0, "loaded"), (30_000, "loading")], "http_500"),  # reloaded long after
    ("http_400", 400, 7, 754, [(0, "loaded"), (800, "loading")], "http_400"),  # the client's own error
    (None, 200, 7, 754, [(0, "loaded"), (800, "loading")], None),
]


@pytest.mark.parametrize(("kind", "status", "send", "end", "changes", "expected"), FAILURES)
def test_failure_kind(kind: str | None, status: int, send: int, end: int, changes: list, expected: str | None) -> None:
    record = _record(0, "a", send, end, end, status=status, error=kind)
    assert failure_kind(record, [_ev(t, "a", s) for t, s in changes]) == expected


def test_parse_models() -> None:
    assert parse_model_mix("smol-a:2,smol-b").entries == (("smol-a", 2), ("smol-b", 1))
    assert parse_model_mix("all").every_listed
    assert parse_model_mix("all").resolved(["x", "y"]).entries == (("x", 1), ("y", 1))
    assert parse_model_mix("a,b").missing(["a"]) == ["b"]
    for bad in ("a:0", "a,a", "a:x", ""):
        with pytest.raises(ConfigError):
            parse_model_mix(bad)


@pytest.mark.parametrize(("api", "model"), [("llamacpp", None), ("chat", "served"), ("completions", None)])
def test_each_body_names_its_model(api: str, model: str | None) -> None:
    mix = ModelMix((("a", 2), ("b", 1)))
    backend = make_backend(api, GenerationParams(prompt="hi", n_predict=4, model_mix=mix), model)
    names = [json.loads(backend.build("salt", i))["model"] for i in range(6)]
    assert names == list(mix.cycle) * 2 and sorted(mix.cycle) == ["a", "a", "b"]
    assert [backend.model_label(i) for i in range(3)] == list(mix.cycle)  # type: ignore[attr-defined]


def test_a_server_that_is_no_router_is_refused_in_one_line(tmp_path) -> None:
    from servers import SimThread, sweep

    with SimThread() as sim:
        proc = sweep("--url", sim.url, "--models", "a,b", "--concurrency", "1", "--requests", "1",
                     "--output", str(tmp_path / "run"), timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "not a llama-server router" in proc.stderr and "--models-dir" in proc.stderr


def test_the_routers_proxy_error_is_model_unloaded() -> None:
    backend = make_backend("chat", GenerationParams(prompt="hi", n_predict=4, model_mix=ModelMix((("a", 1),))), "m")
    assert backend.parse(500, b"proxy error: Failed to read connection").error_kind == MODEL_UNLOADED
    assert backend.parse(500, b'{"error":{"code":500,"message":"x"}}').error_kind != MODEL_UNLOADED


# a model's changes → (loads, unloads): a model already loaded when the poll first sees it is not a
# load; only loads seen happening ("loading" → "loaded", or unloaded → loaded) count
LOADS_SEEN = [
    ([(0, "loaded")], (0, 0)),  # left loaded by an earlier run: no load
    ([(0, "loaded"), (500, "unloaded"), (600, "loading"), (800, "loaded")], (1, 1)),
    ([(0, "unloaded"), (100, "loading"), (300, "loaded")], (1, 0)),
    ([(0, "unloaded"), (100, "loaded")], (1, 0)),  # the loading fell between two polls
    ([(0, "loading"), (300, "loaded")], (1, 0)),  # seen loading: a load
]


@pytest.mark.parametrize(("changes", "expected"), LOADS_SEEN)
def test_only_loads_seen_happening_count(changes: list, expected: tuple[int, int]) -> None:
    (f,) = model_figures([_record(0, "a", 900, 920, 950)], [_ev(t, "a", s) for t, s in changes])
    assert (f.loads, f.unloads) == expected


def test_a_model_loaded_at_the_start_does_not_make_thrash() -> None:
    # the trial: smol-a left loaded by an earlier run, smol-b loaded once; 2 models, no load of smol-a
    events = [_ev(0, "a", "loaded"), _ev(0, "b", "unloaded"), _ev(10, "b", "loading"), _ev(300, "b", "loaded")]
    records = [_record(i, "a" if i % 4 else "b", 5 + i * 400, 320 + i * 400, 330 + i * 400) for i in range(8)]
    figures = model_figures(records, events)
    assert {f.model: f.loads for f in figures} == {"a": 0, "b": 1}
    verdict = thrash_verdict(2, 2, 8, sum(f.waited for f in figures), sum(f.loads for f in figures))
    assert verdict is not None and "(1 load" in verdict.line and "2 loads" not in verdict.line


# (--model) → refused?; a router whose requests would name no model is refused before the first level
@pytest.mark.parametrize(("model", "refused"), [(None, True), ("smol-a", False)])
def test_a_router_without_models_is_refused(model: str | None, refused: bool) -> None:
    from loadgen.run.router import router_without_models

    refusal = router_without_models("smol (127.0.0.1:8080)", model)
    assert (refusal is not None) is refused
    if refusal is not None:
        assert refusal.exit_code == 1 and "\n" not in str(refusal)
        assert "router" in str(refusal) and "--models NAME:W,...|all" in str(refusal) and "--model NAME" in str(refusal)


# (records name a model?) → the sweep's own lines: a router's /metrics is per model, its c=1 wait holds loads
@pytest.mark.parametrize("router", [False, True])
def test_the_sweeps_lines_do_not_contradict_the_router(router: bool) -> None:
    from loadgen.analysis.saturation import analyze_target
    from loadgen.output.tables import overhead_lines

    records = [_record(i, "a" if router else None, i * 1000, 400, 500, prompt_ms=10.0) for i in range(4)]  # type: ignore[arg-type]
    levels = [{"concurrency": 1, "throughput_tok_s": 16.0, "latency_ms": {"mean": 500.0}}]
    v = analyze_target("t", levels, records, [], total_slots=None, metrics_available=False)
    joined = "\n".join(v.lines)
    assert ("start llama-server with --metrics" in joined) is not router
    assert ("/metrics?model=" in joined) is router
    doc = {"config": {"models": "a:1"} if router else {}, "targets": [
        {"label": "t", "verdict": {"label": "t", "overhead_ms": 390.0, "metrics_available": False}}]}
    (line,) = overhead_lines(doc)
    assert ("model loads" in line) is router and "390.0 ms" in line


def test_the_router_summary_goes_into_run_json_report_and_export(tmp_path) -> None:
    from loadgen.analysis.router import router_summary
    from loadgen.output.exporters import CsvExporter, JsonExporter, select
    from loadgen.output.html import verdict_sentences
    from loadgen.output.report_model import RunSource, build_series

    events = [_ev(0, "a", "unloaded"), _ev(10, "a", "loading"), _ev(300, "a", "loaded")]
    records = [_record(0, "a", 0, 320, 400, prompt_ms=20.0), _record(1, "a", 500, 520, 600)]
    summary = router_summary(records, events, 2)
    assert summary.verdict is not None and summary.thrash is False and summary.models_max == 2
    (m,) = summary.models
    assert (m.model, m.requests, m.ok, m.failed, m.loads, m.waited, m.cold_load_ms_p50) == ("a", 2, 2, 0, 1, 1, 300.0)
    run = {"schema": "loadgen.run", "schema_version": 4, "complete": True, "config": {"models": "a:1"},
           "targets": [{"label": "t", "levels": [], "router": msgspec.to_builtins(summary)}]}
    files = dict(CsvExporter().render(select(run, records)))
    lines = files["router.csv"].decode().splitlines()
    assert lines[0] == "target,model,requests,ok,failed,loads,cold_load_ms_p50,waited,models_max,thrash,verdict"
    assert lines[1].startswith("t,a,2,2,0,1,300.0,1,2,False,") and "no thrash" in lines[1]
    levels = json.loads(dict(JsonExporter().render(select(run, records)))["levels.json"])
    assert levels["targets"][0]["router"]["verdict"] == summary.verdict
    (series,) = build_series([RunSource("r", RunDocument.of(run), records, [])])
    assert f"router: {summary.verdict}" in verdict_sentences(series)
    assert any("models behind the router" in g.title for g in series.tables)
