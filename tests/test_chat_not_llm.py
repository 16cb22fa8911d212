"""`chat` against a port that is not an LLM server (issue 46 item 8): told "not an LLM server" by the one
rule of analysis/evidence.py, exit 1, as every other command is."""

from __future__ import annotations

import contextlib
import http.server

import pytest

from servers import in_process_cli, serve_handler


@pytest.fixture
def loadgen(monkeypatch, capsys):
    return in_process_cli(monkeypatch, capsys)


@contextlib.contextmanager
def html_server():
    """Every GET and POST answered 200 with an HTML page (a web server's landing page)."""

    class Html(http.server.BaseHTTPRequestHandler):
        def _page(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = b"<html><body>hello</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _page

        def log_message(self, *args):
            pass

    with serve_handler(Html) as url:
        yield url


def test_chat_against_an_html_page_is_not_an_llm_server(loadgen, tmp_path):
    with html_server() as url:
        code, out, err = loadgen("chat", "--url", url, "--output", tmp_path / "run")
    assert code == 1, (code, out, err)
    lines = [ln for ln in err.splitlines() if "not an LLM server" in ln]
    assert len(lines) == 1 and "a body that is not JSON" in lines[0] and "an HTML page" in lines[0], err
    assert "4 ok" not in out, out


def test_prefix_against_an_html_page_is_given_up(loadgen, tmp_path):
    """prefix stops before any completion: the page does not answer /tokenize (one line, exit 1)."""
    with html_server() as url:
        code, out, err = loadgen("prefix", "--url", url, "--prefix-tokens", "64", "--output", tmp_path / "run")
    assert code == 1, (code, out, err)
    assert "/tokenize, which it does not answer" in err, (out, err)
