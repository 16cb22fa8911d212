"""--api embeddings and rerank (issue 50): the backend's bodies and counts, the check under load's rule
(analysis/embedding_check.py) on tables, the check in the client (run/answer_check.py), the refusals,
and sweeps against the simulator and against a stand-in that corrupts vectors when requests overlap."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
import time

import msgspec
import pytest

from loadgen.analysis.embedding_check import (
    CHECK_TEXTS,
    COSINE_BOUND,
    cosine,
    ranking_mismatch,
    text_figures,
    vectors_mismatch,
)
from loadgen.client.backends import GenerationParams, make_backend
from loadgen.client.backends.embeddings import AnswerBackend
from loadgen.core import records
from loadgen.core.errors import ConfigError
from loadgen.run.answer_check import CheckedBackend, Reference
from loadgen.run.config import check_api, check_items
from loadgen.sim.embeddings import vector
from loadgen.sim.profile import parse_profile
from servers import SimThread, in_process_cli, serve_handler

TEXTS = ("alpha text", "beta text", "gamma text", "delta text")


@pytest.fixture
def loadgen(monkeypatch, capsys):
    return in_process_cli(monkeypatch, capsys)


# --- the rule, on tables written before the code ran ----------------------------------------------

@pytest.mark.parametrize("a, b, expected", [
    ([1.0, 0.0], [2.0, 0.0], 1.0),      # same direction, another length
    ([1.0, 0.0], [0.0, 1.0], 0.0),      # orthogonal
    ([1.0, 0.0], [-1.0, 0.0], -1.0),    # opposite
    ([0.0, 0.0], [0.0, 0.0], 1.0),      # both empty: the same answer
    ([0.0, 0.0], [1.0, 0.0], 0.0),      # one empty: no direction shared
    ([1.0, 0.0], [1.0, 0.0, 0.0], 0.0),  # another width: not the same vector
])
def test_cosine(a, b, expected):
    assert cosine(a, b) == pytest.approx(expected)


REF = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
# (answers under load, their check indexes) -> the input named, or None for a pass
VECTOR_CASES = [
    ([[1.0, 0.0, 0.0]], [0], None),                                   # identical
    ([[2.0, 0.0, 0.0], [0.0, 3.0, 0.0]], [0, 1], None),               # rescaled: same direction
    ([[1.0, 0.02, 0.0]], [0], None),                                  # cosine 0.9998 ≥ 0.999
    ([[1.0, 0.05, 0.0]], [0], 0),                                     # cosine 0.99875 < 0.999
    ([[0.0, 1.0, 0.0], [0.0, 1.0, 0.0]], [0, 1], 0),                  # another input's vector
    ([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]], [1, 2], 2),                  # the second one wrong
    ([[float("nan"), 0.0, 0.0]], [0], 0),                             # NaN never passes
    ([[0.0, 0.0, 0.0]], [2], 2),                                      # an empty vector
]


@pytest.mark.parametrize("got, inputs, named", VECTOR_CASES)
def test_vectors_mismatch_table(got, inputs, named):
    texts = ["first text", "second text", "third text"]
    message = vectors_mismatch(REF, got, inputs, texts)
    if named is None:
        assert message is None
    else:
        assert message is not None and message.startswith(f"input {named} ('{texts[named]}')"), message
        assert f"bound {COSINE_BOUND}" in message


SCORES = [2.0, 1.0, 0.5, 0.5004]  # inputs 2 and 3 within the tolerance of each other
# (scores under load, their check indexes) -> the input named, or None
RANK_CASES = [
    ([2.0, 1.0, 0.5], [0, 1, 2], None),                 # the reference's own
    ([1.0, 2.0], [1, 0], None),                         # documents in another order, the same scores
    ([0.5, 0.5004], [2, 3], None),                      # a tie within the tolerance
    ([0.5004, 0.5], [2, 3], None),                      # which may swap
    ([1.0, 2.0], [0, 1], 1),                            # 1 above 0: input 1 named (ranked too high)
    ([2.0, 0.4, 0.5], [0, 1, 2], 2),                    # 2 above 1
    ([2.0005, 1.0], [0, 1], None),                      # a score moved by less than the tolerance
    ([2.01, 1.0], [0, 1], 0),                           # by more: same order, still a mismatch
    ([float("nan")], [0], 0),
]


@pytest.mark.parametrize("got, inputs, named", RANK_CASES)
def test_ranking_mismatch_table(got, inputs, named):
    texts = ["a first", "a second", "a third", "a fourth"]
    message = ranking_mismatch(SCORES, got, inputs, texts)
    if named is None:
        assert message is None
    else:
        assert message is not None and message.startswith(f"input {named} ('{texts[named]}')"), message


def test_a_long_text_is_named_by_its_start():
    message = vectors_mismatch([[1.0, 0.0]], [[0.0, 1.0]], [0], ["x" * 100])
    assert message is not None and "'" + "x" * 40 + "…'" in message


@pytest.mark.parametrize("ok, tokens, wall, items, expected", [
    (10, 400, 2.0, 4, {"texts": 40, "texts_per_s": 20.0, "input_tok_s": 200.0}),
    (0, 0, 0.0, 4, {"texts": 0, "texts_per_s": 0.0, "input_tok_s": 0.0}),
    (3, 30, 1.5, 1, {"texts": 3, "texts_per_s": 2.0, "input_tok_s": 20.0}),
])
def test_text_figures(ok, tokens, wall, items, expected):
    assert text_figures(ok, tokens, wall, items) == expected


# --- the refusals ---------------------------------------------------------------------------------

@pytest.mark.parametrize("api, items, stream, several, prompt_tokens, refused", [
    ("embeddings", 1, False, False, False, None),
    ("rerank", 8, False, False, False, None),
    ("llamacpp", 1, False, False, False, None),
    ("embeddings", 0, False, False, False, "at least 1"),
    ("chat", 2, False, False, False, "--items applies to --api embeddings or rerank"),
    ("embeddings", 1, True, False, False, "does not stream"),
    ("rerank", 1, False, True, False, "drop --workers"),
    ("embeddings", 1, False, False, True, "drop --prompt-tokens"),
])
def test_check_items(api, items, stream, several, prompt_tokens, refused):
    if refused is None:
        assert check_items(api, items, stream=stream, several_processes=several, prompt_tokens=prompt_tokens) == items
    else:
        with pytest.raises(ConfigError, match=refused):
            check_items(api, items, stream=stream, several_processes=several, prompt_tokens=prompt_tokens)


def test_only_sweep_takes_the_apis_that_answer_without_generating():
    assert check_api("rerank", answers=True) == "rerank"
    with pytest.raises(ConfigError, match="--api embeddings runs in `loadgen sweep`"):
        check_api("embeddings")  # prefill, depth, soak, chat, replay, capacity: they measure generation


# --- the backend and the check in the client ---------------------------------------------------------

def _backend(api: str, items: int) -> AnswerBackend:
    backend = make_backend(api, GenerationParams(prompt="", prompts=TEXTS, items=items), model="m")
    assert isinstance(backend, AnswerBackend)
    return backend


def test_bodies_salt_every_text():
    body = json.loads(_backend("embeddings", 3).build("0123-abcd", 1))
    assert body == {"model": "m", "input": ["[0123-abcd-0] delta text", "[0123-abcd-1] alpha text",
                                            "[0123-abcd-2] beta text"]}
    body = json.loads(_backend("rerank", 1).build("ffff", 2))
    assert body["documents"] == ["[ffff] gamma text"] and body["query"].startswith("[ffff] ")


def _embedding_body(vectors, prompt_tokens=12):
    return msgspec.json.encode({"data": [{"index": i, "embedding": v} for i, v in enumerate(vectors)],
                                "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}})


def test_parse_counts_prompt_tokens_and_no_output():
    outcome = _backend("embeddings", 2).parse(200, _embedding_body([[1.0], [2.0]], 17))
    assert outcome.error_kind is None and outcome.usage is not None
    assert (outcome.usage.prompt_tokens, outcome.usage.completion_tokens, outcome.tokens_predicted) == (17, 0, 0)
    wrong = _backend("embeddings", 3).parse(200, _embedding_body([[1.0], [2.0]]))
    assert wrong.error_kind == records.INVALID_JSON and "2 answers in `data` for 3 texts" in (wrong.error_message or "")
    refused = _backend("embeddings", 1).parse(501, b'{"error":{"code":501,"message":"This server does not support '
                                                   b'embeddings. Start it with `--embeddings`"}}')
    assert refused.error_kind == "http_501" and "--embeddings" in (refused.error_message or "")


def test_checked_backend_judges_every_fourth_request():
    inner = _backend("embeddings", 2)
    reference = Reference(tuple(vector(t) for t in CHECK_TEXTS))
    checked = CheckedBackend(inner, reference, every=4)
    assert json.loads(checked.build("s", 4))["input"] == list(CHECK_TEXTS[2:4])  # unsalted, the next two in turn
    assert json.loads(checked.build("s", 5))["input"][0].startswith("[s-0] ")  # the load, salted
    right = _embedding_body([vector(CHECK_TEXTS[2]), vector(CHECK_TEXTS[3])])
    assert checked.parse_at(4, 200, right).error_kind is None
    swapped = _embedding_body([vector(CHECK_TEXTS[3]), vector(CHECK_TEXTS[2])])
    outcome = checked.parse_at(4, 200, swapped)
    assert outcome.error_kind == records.EMBEDDING_MISMATCH
    assert (outcome.error_message or "").startswith(f"input 2 ('{CHECK_TEXTS[2][:40]}…'): cosine")
    assert outcome.usage is not None and outcome.usage.prompt_tokens == 12  # the counts kept
    assert checked.parse_at(5, 200, swapped).error_kind is None  # not a check request: not judged


# --- sweeps ---------------------------------------------------------------------------------------

def _levels(out):
    return json.loads((out / "run.json").read_text())["targets"][0]["levels"]


@pytest.mark.parametrize("api", ["embeddings", "rerank"])
def test_sweep_against_the_simulator_passes_the_check(loadgen, tmp_path, api):
    with SimThread(embeddings=True, reranking=True) as sim:
        code, out, err = loadgen("sweep", "--url", sim.url, "--api", api, "--items", "3", "--concurrency", "1,4",
                                 "--requests", "16", "--output", tmp_path / "run")
    assert code == 0, (out, err)
    for lv in _levels(tmp_path / "run"):
        assert lv["requests_ok"] == 16 and lv["requests_failed"] == 0
        assert lv["texts"] == 48 and lv["texts_per_s"] > 0 and lv["output_tokens"] == 0
        assert lv["input_tokens"] == lv["server_metrics_delta"]["llamacpp:prompt_tokens_total"]
        assert "answers_short" not in lv
    assert "texts/s" in out and "prompt tok/s" in err


def test_the_profile_prices_a_text_at_embed_tok_s():
    base = 'name = "e"\nmodel_alias = "e"\nprefill_tok_s = 1000.0\nstep_ms = 1\nalpha = 0\nn_ctx = 64\neos_probability = 0\n'
    assert parse_profile(base).embed_ms(50) == pytest.approx(50.0)  # unset: the prefill rate
    assert parse_profile(base + "embed_tok_s = 100\n").embed_ms(50) == pytest.approx(500.0)
    with pytest.raises(ValueError, match="'embed_tok_s' must not be negative"):
        parse_profile(base + "embed_tok_s = -1\n")


def test_the_simulator_gives_a_text_one_vector():
    assert vector("a text") == vector("a text") and vector("a text") != vector("another text")
    assert cosine(vector("a text"), vector("a text")) == pytest.approx(1.0)


def test_a_server_without_embeddings_is_refused_before_the_first_level(loadgen, tmp_path):
    with SimThread() as sim:
        code, out, err = loadgen("sweep", "--url", sim.url, "--api", "embeddings", "--concurrency", "1",
                                 "--requests", "4", "--output", tmp_path / "run")
    assert code == 1, (out, err)
    lines = [ln for ln in err.splitlines() if "does not support embeddings" in ln]
    assert len(lines) == 1 and "POST /v1/embeddings answered http_501" in lines[0], err
    assert _levels(tmp_path / "run") == []


@contextlib.contextmanager
def overlap_corrupting_server():
    """A stand-in llama-server whose /v1/embeddings answers the simulator's vectors, each pushed a
    quarter turn off when another request was in flight while it was answered (ollama #6262's bug)."""
    lock, state = threading.Lock(), {"in_flight": 0}

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _send(self, obj, status=200):
            body = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path in ("/health", "/v1/health"):
                self._send({"status": "ok"})
            elif self.path == "/v1/models":
                self._send({"object": "list", "data": [{"id": "stand-in"}]})
            else:
                self._send({"error": {"code": 404, "message": "File Not Found"}}, 404)

        def do_POST(self):
            texts = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))["input"]
            with lock:
                state["in_flight"] += 1
                overlapped = state["in_flight"] > 1
            time.sleep(0.1)
            with lock:
                overlapped = overlapped or state["in_flight"] > 1
                state["in_flight"] -= 1
            vectors = [vector(t) for t in texts]
            if overlapped:
                vectors = [[x + (0.5 if i == 0 else 0.0) for i, x in enumerate(v)] for v in vectors]
            self._send({"object": "list", "usage": {"prompt_tokens": 4 * len(texts), "total_tokens": 4 * len(texts)},
                        "data": [{"index": i, "embedding": v} for i, v in enumerate(vectors)]})

        def log_message(self, *args):
            pass

    with serve_handler(Handler) as url:
        yield url


def test_a_server_that_corrupts_overlapping_requests_fails_the_check(loadgen, tmp_path):
    with overlap_corrupting_server() as url:
        code, out, err = loadgen("sweep", "--url", url, "--api", "embeddings", "--concurrency", "1,4",
                                 "--requests", "16", "--warmup", "0", "--output", tmp_path / "run")
    alone, loaded = _levels(tmp_path / "run")
    assert alone["errors_by_kind"] == {}, alone  # one at a time: the same vectors
    assert loaded["errors_by_kind"].get(records.EMBEDDING_MISMATCH, 0) >= 1, loaded
    failures = [json.loads(line) for line in (tmp_path / "run" / "requests.jsonl").read_text().splitlines()]
    messages = [r["error_message"] for r in failures if r.get("error_kind") == records.EMBEDDING_MISMATCH]
    assert messages and all(m.startswith("input ") and "cosine" in m for m in messages), messages
    for m in messages:  # each names its input: the check index and the start of that text
        index = int(m.split()[1])
        assert m.startswith(f"input {index} ('{CHECK_TEXTS[index][:40]}"), m  # the input named by its text
    assert "embedding_mismatch" in err, err
