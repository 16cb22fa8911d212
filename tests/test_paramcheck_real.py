"""`loadgen paramcheck` against the real llama-server test bed: through nginx as a plain reverse proxy
every checked parameter is honoured; through a gateway that drops temperature and seed and rewrites
max_tokens (nginx with an njs script, and a Python proxy) exactly those are named and the exit code is 1; a via URL that leads to another server is
bad input. The server is a 1-slot one of this module's own, so no other test's task is taken for a canary."""

from __future__ import annotations

import json
import subprocess

import pytest

from servers import (
    LOADGEN,
    RewritingProxy,
    drop_temperature_and_seed,
    reverse_proxy,
    start_llama_server,
    start_lossy_nginx,
    start_nginx,
)

pytestmark = pytest.mark.real

ALL = "temperature,top_p,top_k,min_p,seed,max_tokens,presence_penalty,frequency_penalty,repeat_penalty,stop,logprobs"


def paramcheck(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*LOADGEN, "paramcheck", *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = start_llama_server("paramcheck", 1, tmp_path_factory.mktemp("paramcheck-logs"))
    yield s
    s.stop()


def verdicts(out):
    doc = json.loads((out / "paramcheck.json").read_text())
    return doc, {p["param"]: p["verdict"] for p in doc["params"]}


@pytest.mark.parametrize("api", ["llamacpp", "chat"])
def test_through_a_plain_reverse_proxy_every_parameter_is_honoured(server, tmp_path, api):
    with start_nginx(reverse_proxy("/gw/llama", server.url)) as nginx:
        out = tmp_path / "pc"
        proc = paramcheck("--direct", server.url, "--via", f"{nginx.url}/gw/llama/v1?api-version=1", "--api", api,
                          "--params", ALL, "--output", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc, got = verdicts(out)
    shown = set(ALL.split(",")) - ({"stop"} if api == "chat" else set())  # chat: stop is echoed nowhere
    assert {p: v for p, v in got.items() if p in shown} == {p: "honoured" for p in shown}
    if api == "chat":
        assert got["stop"] == "cannot tell"
    assert doc["via"].endswith("/gw/llama/v1?api-version=1") and doc["exit_code"] == 0


@pytest.mark.parametrize("api,gateway_kind", [("chat", "nginx-njs"), ("llamacpp", "nginx-njs"),
                                              ("completions", "python")])
def test_a_lossy_gateway_is_named_exactly_and_fails(server, tmp_path, api, gateway_kind):
    if gateway_kind == "nginx-njs":
        gateway = start_lossy_nginx(server.url)
        via = gateway.url + "/lossy"
    else:
        gateway = RewritingProxy(server.url, drop_temperature_and_seed).__enter__()
        via = gateway.url
    try:
        out = tmp_path / "pc"
        proc = paramcheck("--direct", server.url, "--via", via, "--api", api, "--params", ALL, "--output", str(out))
    finally:
        gateway.__exit__(None, None, None)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    doc, got = verdicts(out)
    failing = {p: v for p, v in got.items() if v != "honoured" and not (p == "stop" and api != "llamacpp")}
    assert failing == {"temperature": "dropped", "seed": "dropped", "max_tokens": "altered"}
    assert "not passed as sent: temperature, seed, max_tokens" in " ".join(proc.stdout.split())


def test_a_via_url_of_another_server_is_bad_input(server, tmp_path):
    other = start_llama_server("another-model", 1, tmp_path)
    try:
        proc = paramcheck("--direct", server.url, "--via", other.url, "--api", "chat", "--params", "temperature",
                          "--output", str(tmp_path / "pc"))
    finally:
        other.stop()
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "is not a proxy of --direct" in lines[0] and "'another-model'" in lines[0]
    assert "Traceback" not in proc.stderr
