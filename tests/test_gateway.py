"""A server behind a gateway: Debian's nginx as a reverse proxy under a path prefix.

The same sweep through `.../prefix`, `.../prefix/v1` (the OpenAI convention) and `.../prefix?query`
must give the same records as the server called directly, with every API and both transports; the
nginx access log shows where each request went. Run against the simulator (fast) and the real
llama-server test bed (`real`).
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from loadgen.results.reader import load_probe, load_records, load_run_dict
from servers import SimProcess, reverse_proxy, start_nginx, sweep

PREFIX = "/team-a/llama"
QUERY = "api-version=2024-06-01&subscription-key=gw-secret-123"  # a key: masked in every file


@pytest.fixture(scope="module", params=["sim", pytest.param("real", marks=pytest.mark.real)])
def upstream(request):
    """(kind, the server's own URL): the simulator, or the real test bed's 4-slot llama-server."""
    if request.param == "real":
        four, _ = request.getfixturevalue("real_servers")
        yield "real", four.url
        return
    with SimProcess("--profile", "smoke", "--slots", "2", "--time-scale", "0.05") as sim:
        yield "sim", sim.url


@pytest.fixture(scope="module")
def gateway(upstream):
    """nginx passing PREFIX/... to the server, and (`/only`) a route that forwards nothing but the
    completion endpoints, as many gateways do; everything else is 404."""
    _, server = upstream
    only = f"""
        location ~ ^/only/(completion|v1/completions|v1/chat/completions|v1/models)$ {{
            proxy_pass {server}/$1$is_args$args;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    """
    with start_nginx(only + reverse_proxy(PREFIX, server)) as nginx:
        yield nginx


def outcomes(records, label):
    """What a target's requests came back with, as a multiset: everything but the times and salts."""
    return Counter((r.level, r.status, r.error_kind, r.output_tokens, r.prompt_n, r.stop_type, r.finish_reason)
                   for r in records if r.target == label)


CASES = [("llamacpp", "--no-stream", "fast"), ("completions", "--stream", "fast"), ("chat", "--stream", "aiohttp"),
         ("chat", "--no-stream", "fast"), ("llamacpp", "--stream", "aiohttp"), ("responses", "--stream", "fast"),
         ("messages", "--stream", "aiohttp")]


# The real server takes three of the cases (a native, a chat and an Anthropic one; both transports,
# both stream modes): every case's URL joining is the client's and the simulator runs them all; the
# real server shows its answers pass the gateway unchanged (each real case is ~30 s of a CI worker).
REAL_CASES = [CASES[0], CASES[2], CASES[6]]


@pytest.mark.parametrize("upstream,api,stream,transport",
                         [pytest.param("sim", *c, id="sim-" + "-".join(c)) for c in CASES]
                         + [pytest.param("real", *c, id="real-" + "-".join(c), marks=pytest.mark.real)
                            for c in REAL_CASES], indirect=["upstream"])
def test_a_sweep_through_the_gateway_gives_the_records_of_a_direct_one(upstream, gateway, tmp_path, api, stream,
                                                                        transport):
    kind, server = upstream
    bases = {"direct": server, "prefix": gateway.url + PREFIX + "/", "v1": gateway.url + PREFIX + "/v1",
             "query": f"{gateway.url}{PREFIX}?{QUERY}"}
    out = tmp_path / "run"
    before = len(gateway.access_log())
    args = [a for label, url in bases.items() for a in ("--url", url, "--label", label)]
    proc = sweep(*args, "--api", api, stream, "--transport", transport, "--concurrency", "1,2", "--requests", "4",
                 "--n-predict", "8", "--prompt-tokens", "96", "--warmup", "1", "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    records = load_records(out)
    direct = outcomes(records, "direct")
    assert sum(direct.values()) == 8 and all(status == 200 for (_, status, *_rest) in direct)
    for label in ("prefix", "v1", "query"):
        assert outcomes(records, label) == direct, label
    # every request and probe went under the prefix; /v1 was never doubled; the query went on each
    sent = gateway.access_log()[before:]
    endpoint = {"llamacpp": "/completion", "completions": "/v1/completions", "chat": "/v1/chat/completions",
                "responses": "/v1/responses", "messages": "/v1/messages"}[api]
    posts = [line.split()[1] for line in sent if line.startswith("POST ") and "tokenize" not in line
             and "apply-template" not in line]
    assert len(posts) == 3 * (8 + 1)  # three gateway targets: 8 requests + 1 warm-up each
    assert Counter(posts) == Counter({f"{PREFIX}{endpoint}": 18, f"{PREFIX}{endpoint}?{QUERY}": 9})
    # how --prompt-tokens measures: the chat template's APIs through /apply-template
    tokenizer = "/apply-template" if api in ("chat", "responses", "messages") else "/tokenize"
    for path in ("/health", "/props", "/slots", "/metrics", tokenizer):
        assert any(line.split()[1].startswith(PREFIX + path) for line in sent), path
    assert not any("/v1/v1" in line for line in sent)
    # the key is in no file; the URL is shown masked
    text = "".join(p.read_text() for p in out.rglob("*") if p.is_file())
    assert "gw-secret-123" not in text and "gw-secret-123" not in proc.stdout + proc.stderr
    urls = {t["label"]: t["url"] for t in load_run_dict(out)["targets"]}
    assert urls["query"] == f"{gateway.url}{PREFIX}?api-version=2024-06-01&subscription-key=***"
    assert urls["v1"] == gateway.url + PREFIX + "/v1"


def test_server_url_reads_slots_and_metrics_the_gateway_does_not_forward(upstream, gateway, tmp_path):
    kind, server = upstream
    out = tmp_path / "run"
    only = gateway.url + "/only/v1"
    proc = sweep("--url", only, "--label", "blind", "--url", only + "?via=2", "--label", "seeing",
                 "--server-url", f",{server}", "--api", "chat", "--concurrency", "1,2", "--requests", "4",
                 "--n-predict", "8", "--probe-interval", "0.05", "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    targets = {t["label"]: t for t in load_run_dict(out)["targets"]}
    assert not targets["blind"]["server"]["metrics_enabled"] and targets["blind"]["server"]["total_slots"] is None
    seeing = targets["seeing"]
    assert seeing["server"]["metrics_enabled"] and seeing["server"]["total_slots"] == (4 if kind == "real" else 2)
    assert seeing["verdict"]["total_slots"] == seeing["server"]["total_slots"]
    samples = [s for s in load_probe(out) if s.target == "seeing"]
    assert samples and all(s.requests_processing is not None and s.busy_slots is not None for s in samples)
    assert not [s for s in load_probe(out) if s.target == "blind"]
    assert json.dumps(targets["seeing"]["url"]) == json.dumps(only + "?via=2")
