"""The API key never appears in the results, on stdout or on stderr: not when the server refuses it
(401), not when the server echoes it back in an error, not when the run fails or is stopped.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from servers import AppThread

SECRET = "sk-reliability-7c4f0b1e-never-print-me"


class EchoingServer(AppThread):
    """A server that checks `Authorization` and, as some proxies do, quotes it back in its errors.

    mode "refuse": every completion is a 401 quoting the header; "accept-then-fail": the right key
    gets 500s quoting it (in a JSON body, or in a stream's error event with `stream`).
    """

    def __init__(self, mode: str):
        super().__init__()
        self.mode = mode
        self.seen: list[str | None] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", lambda r: web.json_response({"status": "ok"}))
        app.router.add_get("/props", self.guarded(lambda r: web.json_response(
            {"total_slots": 1, "model_alias": "echo", "default_generation_settings": {"n_ctx": 512}})))
        app.router.add_get("/slots", self.guarded(lambda r: web.json_response([])))
        app.router.add_get("/metrics", self.guarded(lambda r: web.Response(text="# nothing\n")))
        app.router.add_get("/v1/models", self.guarded(lambda r: web.json_response({"data": [{"id": "echo"}]})))
        for path in ("/completion", "/v1/completions", "/v1/chat/completions"):
            app.router.add_post(path, self.guarded(self.complete))
        return app

    def guarded(self, handler):
        async def wrapped(request: web.Request) -> web.StreamResponse:
            auth = request.headers.get("Authorization")
            self.seen.append(auth)
            if self.mode == "refuse" or auth != f"Bearer {SECRET}":
                return web.json_response({"error": {"code": 401, "type": "authentication_error",
                                                    "message": f"Invalid API Key: {auth}"}}, status=401)
            result = handler(request)
            return await result if asyncio.iscoroutine(result) else result
        return wrapped

    async def complete(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        error = {"error": {"code": 500, "type": "server_error",
                           "message": f"upstream refused {request.headers['Authorization']}"}}
        if not body.get("stream"):
            return web.json_response(error, status=500)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"content": "x", "stop": false}\n\n')
        await response.write(b"data: " + json.dumps(error).encode() + b"\n\n")
        await response.write_eof()
        return response

    @property
    def url(self) -> str:
        return self.origin


def assert_nowhere(out, *texts: str) -> None:
    for text in texts:
        assert SECRET not in text
    for f in out.rglob("*"):
        if f.is_file():
            assert SECRET.encode() not in f.read_bytes(), f


@pytest.mark.parametrize("how", ["env", "flag"])
@pytest.mark.parametrize("mode,api,stream", [
    ("refuse", "llamacpp", False), ("refuse", "chat", True),
    ("accept-then-fail", "llamacpp", False), ("accept-then-fail", "llamacpp", True),
    ("accept-then-fail", "chat", True)])
def test_the_key_is_written_nowhere_when_the_server_quotes_it_back(loadgen, tmp_path, monkeypatch, how, mode, api,
                                                                    stream):
    out = tmp_path / "run"
    key_args = ["--api-key", SECRET] if how == "flag" else []
    if how == "env":
        monkeypatch.setenv("LOADGEN_API_KEY", SECRET)
    with EchoingServer(mode) as server:
        code, stdout, stderr = loadgen("sweep", "--url", server.url, "--api", api, *(["--stream"] if stream else []),
                                       *key_args, "--concurrency", "1,2", "--requests", "4", "--warmup", "1",
                                       "--no-histograms", "--output", out)
    assert f"Bearer {SECRET}" in server.seen  # it was sent
    assert "Traceback" not in stderr
    assert_nowhere(out, stdout, stderr)
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert records and all(r["error_kind"] for r in records)
    assert all("***" in r["error_message"] for r in records), records[0]["error_message"]
    assert code in (0, 1)


def test_the_key_is_written_nowhere_when_the_run_is_stopped(loadgen, tmp_path, monkeypatch):
    """A target that is down and one that refuses the key, in one run: errors, not tracebacks."""
    monkeypatch.setenv("LOADGEN_API_KEY", SECRET)
    out = tmp_path / "run"
    with EchoingServer("refuse") as server:
        code, stdout, stderr = loadgen("sweep", "--url", server.url, "--url", "http://127.0.0.1:9",
                                       "--concurrency", "1", "--requests", "2", "--warmup", "0",
                                       "--no-histograms", "--output", out)
    assert code == 1
    assert_nowhere(out, stdout, stderr)
