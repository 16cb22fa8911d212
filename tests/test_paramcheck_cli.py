"""`loadgen paramcheck`'s bad input: one line on stderr and exit 2, no request needed (or only to a
server that is not a llama-server with /props)."""

from __future__ import annotations

import pytest

from servers import RawListener, in_process_cli

BAD = [
    (["--direct", "http://127.0.0.1:1", "--via", "http://127.0.0.1:2", "--params", "temperature,bogus"],
     "--params: 'bogus' not checked"),
    (["--direct", "http://127.0.0.1:1", "--via", "http://127.0.0.1:2", "--params", "seed,seed"], "listed twice"),
    (["--direct", "http://127.0.0.1:1", "--via", "ftp://gw/x"], "--via"),
    (["--direct", "http://127.0.0.1:1/v1/chat/completions", "--via", "http://127.0.0.1:2"], "an endpoint"),
    (["--direct", "http://127.0.0.1:1", "--via", "http://127.0.0.1:2", "--api", "grpc"], "--api"),
]


@pytest.mark.parametrize("args,expected", BAD, ids=[" ".join(a[-2:]) for a, _ in BAD])
def test_bad_input_is_one_line_and_exit_2(monkeypatch, capsys, tmp_path, args, expected):
    code, out, err = in_process_cli(monkeypatch, capsys)("paramcheck", *args, "--output", tmp_path / "pc")
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and expected in err, err


def test_a_direct_url_without_llama_server_props_is_bad_input(monkeypatch, capsys, tmp_path):
    not_found = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    with RawListener(lambda _: not_found) as listener:
        url = f"http://127.0.0.1:{listener.port}"
        code, out, err = in_process_cli(monkeypatch, capsys)("paramcheck", "--direct", url, "--via", url,
                                                             "--output", tmp_path / "pc")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "no llama-server /props there" in err, err
    assert not (tmp_path / "pc").exists()
