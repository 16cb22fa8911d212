"""No verdict without evidence, and a server that is not an LLM server is said to be one line, exit 1
(issue 16, item 10)."""

from __future__ import annotations

import contextlib
import http.server
import json

import pytest

from loadgen.analysis.evidence import not_an_llm_server
from loadgen.analysis.saturation import analyze_target
from loadgen.core.records import RequestRecord
from servers import SimThread, serve_handler

MS = 1_000_000


@contextlib.contextmanager
def plain_web_server():
    """`python3 -m http.server` in a thread: GET answers, POST is HTTP 501."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    with serve_handler(Quiet) as url:
        yield url


@pytest.mark.parametrize("warmup", ["2", "0"])
def test_a_plain_web_server_is_one_line_and_exit_1(loadgen, tmp_path, warmup):
    with plain_web_server() as url:
        code, out, err = loadgen("sweep", "--url", url, "--concurrency", "1,2", "--warmup", warmup,
                                 "--output", tmp_path / "run")
    assert code == 1, (out, err)
    lines = [ln for ln in err.splitlines() if "not an LLM server" in ln]
    assert len(lines) == 1 and url in lines[0] and "POST /completion answered HTTP 501" in lines[0]
    assert "not saturated" not in out and "saturates" not in out
    doc = json.loads((tmp_path / "run" / "run.json").read_text())
    levels = doc["targets"][0]["levels"]
    assert len(levels) == (0 if warmup == "2" else 1)  # given up after the first level that showed it


def test_the_answers_of_a_server_without_the_endpoint_are_recognised():
    def rec(seq, kind, message="nope", status=501):
        return RequestRecord(target="t", level=1, worker=0, seq=seq, salt="s", send_ns=0, complete_ns=MS,
                             status=status, error_kind=kind, error_message=message)

    assert "answered HTTP 404 to all 2 requests" in not_an_llm_server([rec(0, "http_404"), rec(1, "http_404")],
                                                                       "POST /v1/chat/completions")
    html = rec(0, "invalid_json", "not JSON: <html><body>hello</body></html>", status=200)
    assert "answered a body that is not JSON to its one request (an HTML page)" in not_an_llm_server([html], "POST /x")
    shape = rec(0, "invalid_json", "response has no `timings` object", status=200)
    assert not_an_llm_server([shape], "POST /completion") is None  # JSON of the wrong shape: not called so
    # an LLM server having a bad time is not called something else
    assert not_an_llm_server([rec(0, "http_500"), rec(1, "http_501")], "POST /completion") is None
    assert not_an_llm_server([rec(0, "http_501"), rec(1, None)], "POST /completion") is None
    assert not_an_llm_server([], "POST /completion") is None


def test_a_target_dead_since_the_first_level_gets_no_verdict_but_the_reason():
    levels = [{"concurrency": 1, "level": 1, "requests_ok": 0, "requests_failed": 3, "throughput_tok_s": 0.0,
               "latency_ms": None, "errors_by_kind": {"connect_error": 3},
               "stopped_reason": "target down: connection refused"}]
    v = analyze_target("dead", levels, [], [], total_slots=4, metrics_available=True).to_dict()
    assert v["saturated_at"] is None
    assert v["verdict"] == ["dead: no saturation verdict, because no level completed a request: every request "
                            "failed (connect_error ×3), then target down: connection refused."]


def test_a_server_failing_every_request_gets_no_verdict_and_no_client_warning(loadgen, tmp_path, monkeypatch):
    # Make the client-bottleneck check fire on every level: only a level with a completed request may say it.
    monkeypatch.setattr("loadgen.run.level_runner.bottleneck_warning", lambda load, read_clock: "CLIENT-WARNING")
    with SimThread(faults=["http_500:1.0"]) as sim:
        code, out, err = loadgen("sweep", "--url", sim.url, "--concurrency", "1,2", "--requests", "2",
                                 "--warmup", "0", "--n-predict", "4", "--output", tmp_path / "run")
    assert code == 0, err  # an LLM server's failures are counted, not fatal
    assert "no saturation verdict, because no level completed a request: every request failed (http_500 ×4)" in out
    assert "not saturated" not in out and "CLIENT-WARNING" not in err
    with SimThread() as sim:
        code, out, err = loadgen("sweep", "--url", sim.url, "--concurrency", "1", "--requests", "2",
                                 "--warmup", "0", "--n-predict", "4", "--output", tmp_path / "ok")
    assert code == 0 and "CLIENT-WARNING" in err
