"""`loadgen slots` without a real server: the verdict of a cycle on a table of cases written down
first, the slot actions' answers read as llama-server sends them, and the command against stand-in
servers: one that "restores" but re-processes (llama.cpp #26676) is named so, one without
--slot-save-path stops it before the first cycle (exit 1), a slot it lacks is the user's (exit 2)."""

from __future__ import annotations

import http.server
import json
import threading
from urllib.parse import parse_qs, urlparse

import pytest

from fixture_server import sse
from loadgen.analysis.slots import (
    FAILED,
    NOT_FASTER,
    REPROCESSED,
    RESTORED,
    CycleFigures,
    cycle_verdict,
    summarize_slots,
)
from loadgen.client.slot_actions import SlotActionFailed, parse_action
from loadgen.results.reader import load_run
from servers import in_process_cli, serve_handler

NO_SAVE_PATH = b'{"error":{"code":501,"message":"This server does not support slots action. Start it with ' \
               b'`--slot-save-path`","type":"not_supported_error"}}'


def ok(**kw) -> CycleFigures:
    """A cycle that restored: 400 prompt tokens saved as 403, turn 2 reused them all, 10x faster."""
    base = dict(slot=0, prompt_tokens=400, n_saved=403, n_written=9_300_000, save_ms=3.0, n_restored=403,
                n_read=9_300_000, restore_ms=2.0, cache_n=403, ttft_ms=100.0, control_cache_n=0,
                control_ttft_ms=1000.0)
    return CycleFigures(**{**base, **kw})


# (case, figures, expected verdict) — the expected answers written before the rule
VERDICTS = [
    ("every saved token reused, fast", ok(), RESTORED),
    ("cache_n exactly prompt tokens - 1 (the last prompt token is always re-evaluated)", ok(cache_n=399), RESTORED),
    ("cache_n two short of the prompt tokens", ok(cache_n=398), REPROCESSED),
    ("restore said 403 tokens, turn 2 reused none (#26676)", ok(cache_n=0), REPROCESSED),
    ("reused, but TTFT just above half the control's", ok(ttft_ms=501.0), NOT_FASTER),
    ("reused, TTFT exactly half the control's", ok(ttft_ms=500.0), RESTORED),
    ("reused, no control to compare against", ok(control_ttft_ms=None), RESTORED),
    ("the restore restored nothing", ok(n_restored=0), FAILED),
    ("the restore's count missing", ok(n_restored=None), FAILED),
    ("turn 2 said no cache_n", ok(cache_n=None), FAILED),
    ("a step failed", ok(error="turn 2 failed: http: 500"), FAILED),
    ("a step failed though the figures look restored", ok(error="slot action refused: HTTP 400"), FAILED),
]


@pytest.mark.parametrize("case,figures,expected", VERDICTS, ids=[c for c, _, _ in VERDICTS])
def test_cycle_verdict(case, figures, expected):
    verdict, why = cycle_verdict(figures)
    assert verdict == expected, why
    assert why


def test_a_reprocessed_cycle_says_what_the_restore_claimed_and_the_issue():
    _, why = cycle_verdict(ok(cache_n=0))
    assert "n_restored 403" in why and "reused 0" in why and "#26676" in why


def test_bytes_per_token_from_the_file_else_n_written():
    assert ok(file_bytes=806_000, n_saved=403).bytes_per_token == 2000
    assert ok(file_bytes=None, n_written=403_000, n_saved=403).bytes_per_token == 1000
    assert ok(n_saved=0).bytes_per_token is None


def test_summary_counts_verdicts_and_says_the_worst():
    s = summarize_slots([ok(), ok(ttft_ms=200.0, save_ms=5.0), ok(cache_n=0)])
    assert s.by_verdict == {RESTORED: 2, REPROCESSED: 1} and s.verdict == REPROCESSED
    assert s.save_ms == pytest.approx((3 + 5 + 3) / 3)
    assert s.ttft_restored_ms == pytest.approx(150.0)  # over the restored cycles only
    assert s.ttft_control_ms == pytest.approx(1000.0)
    assert summarize_slots([ok(), ok()]).verdict == RESTORED


def test_slot_actions_read_as_llama_server_answers():
    saved = parse_action("save", 200, b'{"id_slot":0,"filename":"a.bin","n_saved":414,"n_written":9545960,'
                                      b'"timings":{"save_ms":3.671}}', 4.0)
    assert (saved.n_saved, saved.n_written, saved.save_ms) == (414, 9545960, 3.671)
    restored = parse_action("restore", 200, b'{"id_slot":0,"filename":"a.bin","n_restored":414,'
                                            b'"n_read":9545960,"timings":{"restore_ms":2.614}}', 3.0)
    assert (restored.n_restored, restored.n_read, restored.restore_ms) == (414, 9545960, 2.614)
    with pytest.raises(SlotActionFailed, match="HTTP 501: This server does not support slots action"):
        parse_action("save", 501, NO_SAVE_PATH, 1.0)


def test_a_slot_action_without_an_answer_is_told_not_raised():
    import asyncio

    from loadgen.client.slot_actions import SlotClient
    from servers import refused_port

    async def erase(url: str) -> None:
        async with SlotClient(url, timeout_s=5) as client:
            await client.erase(0)

    with refused_port() as port, pytest.raises(SlotActionFailed, match="no answer to erase") as info:
        asyncio.run(erase(f"http://127.0.0.1:{port}"))
    assert info.value.status is None


class StandIn:
    """A llama-server of 2 slots that answers slot actions as a real one does (or refuses them, as
    one without --slot-save-path: `refuse`), and whose every /completion reports cache_n 0: its
    restore says success, its next turn re-processes."""

    def __init__(self, refuse: bool = False) -> None:
        self.actions: list[tuple[int, str]] = []
        self.completions: list[dict] = []  # each /completion body
        lock, actions, completions = threading.Lock(), self.actions, self.completions

        class Handler(http.server.BaseHTTPRequestHandler):
            def _json(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                answers = {"/health": {"status": "ok"}, "/slots": [{"id": 0}, {"id": 1}],
                           "/props": {"total_slots": 2, "default_generation_settings": {"n_ctx": 4096}}}
                found = answers.get(self.path)
                self._json(200 if found is not None else 404, json.dumps(found or {"error": "no"}).encode())

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                url = urlparse(self.path)
                if url.path.startswith("/slots/"):
                    slot, action = int(url.path.rsplit("/", 1)[1]), parse_qs(url.query)["action"][0]
                    with lock:
                        actions.append((slot, action))
                    if refuse:
                        self._json(501, NO_SAVE_PATH)
                        return
                    name = json.loads(body or b"{}").get("filename")
                    answer = {"save": {"n_saved": 23, "n_written": 23_000, "timings": {"save_ms": 1.5}},
                              "restore": {"n_restored": 23, "n_read": 23_000, "timings": {"restore_ms": 1.0}},
                              "erase": {"n_erased": 23}}[action]
                    self._json(200, json.dumps({"id_slot": slot, "filename": name, **answer}).encode())
                    return
                if url.path != "/completion":  # no /tokenize: turn 1's length is estimated
                    self._json(404, b'{"error":"no"}')
                    return
                with lock:
                    completions.append(json.loads(body))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                for i in range(3):
                    self.wfile.write(sse({"content": "x", "stop": False, "tokens_predicted": i + 1}))
                self.wfile.write(sse({"content": "", "stop": True, "tokens_predicted": 3, "stop_type": "limit",
                                      "timings": {"prompt_n": 20, "prompt_ms": 4.0, "predicted_n": 3,
                                                  "predicted_ms": 6.0, "cache_n": 0}}))
                self.close_connection = True

            def log_message(self, *args):
                pass

        self.handler = Handler


@pytest.fixture
def loadgen(monkeypatch, capsys):
    return in_process_cli(monkeypatch, capsys)


def test_a_stand_in_that_restores_but_reprocesses_is_named_so(loadgen, tmp_path):
    stand_in, out = StandIn(), tmp_path / "slots"
    with serve_handler(stand_in.handler) as url:
        code, stdout, err = loadgen("slots", "--url", url, "--cycles", "2", "--prompt-tokens", "16",
                                    "--output", out)
    assert code == 0, err
    section = load_run(out).targets[0].slots
    assert section is not None and [c.verdict for c in section.rows] == [REPROCESSED, REPROCESSED]
    assert section.verdict == REPROCESSED and section.rows[0].n_restored == 23 and section.rows[0].cache_n == 0
    assert "re-processed" in stdout
    # per cycle: save, erase (forget), restore, erase (before the control), after the preflight's erase
    assert stand_in.actions == [(0, "erase")] + [(0, "save"), (0, "erase"), (0, "restore"), (0, "erase")] * 2
    # read back through the kind's view: analyze's table and answer line, export's rows
    code, stdout, err = loadgen("analyze", out)
    assert code == 0, err
    assert "loadgen slots" in stdout and "2 re-processed of 2 cycle(s)" in stdout
    code, _, err = loadgen("export", out, "--format", "csv")
    assert code == 0, err
    rows = (out / "slots.csv").read_text().splitlines()
    assert len(rows) == 3 and "re-processed" in rows[1]


def test_a_scenario_may_name_slots_as_its_mode(loadgen, tmp_path):
    path = tmp_path / "slots.toml"
    path.write_text('mode = "slots"\nurl = "http://127.0.0.1:9"\nslot = "0"\ncycles = 2\nforget = "other"\n')
    code, out, err = loadgen("run", path, "--check")
    assert code == 0 and "all valid" in out, err


def test_a_server_without_slot_save_path_stops_it_before_the_first_cycle(loadgen, tmp_path):
    stand_in, out = StandIn(refuse=True), tmp_path / "slots"
    with serve_handler(stand_in.handler) as url:
        code, stdout, err = loadgen("slots", "--url", url, "--output", out)
    assert code == 1
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Start it with `--slot-save-path`" in lines[0], err
    assert not out.exists()  # nothing was sent before: no run folder


@pytest.mark.parametrize("args,said", [
    (("--slot", "2"), "--slot 2: the server has 2 slot(s), ids 0 to 1"),
    (("--slot", "0,1", "--concurrency", "1"), "none is left for the background load"),
])
def test_a_slot_the_server_lacks_is_the_users(loadgen, tmp_path, args, said):
    stand_in = StandIn()
    with serve_handler(stand_in.handler) as url:
        code, _, err = loadgen("slots", "--url", url, *args, "--output", tmp_path / "slots")
    assert code == 2 and said in err, err
    assert stand_in.actions == []


def test_under_load_the_cycles_keep_their_slot_and_the_load_takes_the_other(loadgen, tmp_path):
    stand_in, out = StandIn(), tmp_path / "slots"
    with serve_handler(stand_in.handler) as url:
        code, _, err = loadgen("slots", "--url", url, "--slot", "0", "--cycles", "2", "--concurrency", "2",
                               "--prompt-tokens", "16", "--output", out)
    assert code == 0, err
    section = load_run(out).targets[0].slots
    assert section is not None and section.concurrency == 2 and section.background_ok >= 2
    assert section.background_failed == 0
    assert all(b["cache_prompt"] is True and b["stream"] is True for b in stand_in.completions)
    slots = [b["id_slot"] for b in stand_in.completions]
    assert slots.count(0) == 2 * 3  # turn 1, turn 2 and the control of each cycle
    assert slots.count(1) == section.background_ok and set(slots) == {0, 1}
    assert stand_in.actions.count((1, "erase")) == 0  # no slot action on the load's slot
