"""`--ray ADDRESS` refused or reached in one line: an address Ray does not take (`bogus://x`) before
Ray is imported, a head that does not answer within a few seconds (a closed loopback port, a full
backlog) before Ray is asked to connect (Ray retries for minutes, printing each retry). No Ray
cluster is started here.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loadgen.core.errors import ConfigError
from loadgen.run.workers.ray_address import RAY_CLIENT_PORT, ray_endpoint, reach_ray
from servers import run_cli
from test_results_fuzz import FUZZ, assert_clean

try:
    import ray  # noqa: F401
    HAVE_RAY = True
except ImportError:
    HAVE_RAY = False
needs_ray = pytest.mark.skipif(not HAVE_RAY, reason="Ray is not installed: pip install 'loadgen[ray]'")


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def full_backlog() -> Iterator[int]:
    """A loopback port that listens but answers no new connection: its backlog is full, so a
    connect waits (as for a host that drops packets) until the caller's timeout."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    waiting = []
    for _ in range(4):
        c = socket.socket()
        c.setblocking(False)
        c.connect_ex(("127.0.0.1", port))
        waiting.append(c)
    try:
        yield port
    finally:
        for c in waiting:
            c.close()
        server.close()


# Address -> (host, port), or None for "no address yet"; written down before the code.
ENDPOINTS = [
    ("local", None),
    ("auto", None),
    ("10.0.0.5:6379", ("10.0.0.5", 6379)),
    ("head.internal:6379", ("head.internal", 6379)),
    ("[::1]:6379", ("::1", 6379)),
    ("ray://10.0.0.5:10001", ("10.0.0.5", 10001)),
    ("ray://head.internal", ("head.internal", RAY_CLIENT_PORT)),
]
REFUSED = ["bogus://x", "http://127.0.0.1:8265", "x", "10.0.0.5", "10.0.0.5:", "10.0.0.5:0", "10.0.0.5:65536",
           "10.0.0.5:port", ":6379", "ray://", "ray://host:6379/path", "ray://user@host:1", "", "127.0.0.1:1\n",
           "127.0.0.1 :1", "://x"]


@pytest.mark.parametrize("address, expected", ENDPOINTS)
def test_addresses_ray_takes(address, expected):
    assert ray_endpoint(address) == expected


@pytest.mark.parametrize("address", REFUSED)
def test_addresses_refused_in_one_line(address):
    with pytest.raises(ConfigError, match="not a Ray address|scheme is not Ray's") as caught:
        ray_endpoint(address)
    assert "\n" not in str(caught.value)


@FUZZ
@given(address=st.text(max_size=30) | st.builds(lambda s, h, p: f"{s}{h}:{p}",
                                                  st.sampled_from(["", "ray://", "bogus://", "RAY://", "ray:/"]),
                                                  st.text(max_size=10), st.integers(-5, 70000)))
def test_any_text_is_an_endpoint_or_one_line(address):
    try:
        endpoint = ray_endpoint(address)
    except ConfigError as exc:
        assert "\n" not in str(exc)
        return
    if endpoint is not None:
        host, port = endpoint
        assert host and 1 <= port <= 65535


def test_bogus_is_refused_before_ray_is_imported(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # importing it now would fail with "needs Ray"
    code, _, err = run_cli("sweep", "--url", "http://127.0.0.1:9", "--workers", "2", "--ray", "bogus://x",
                               "--output", tmp_path / "r")
    assert code == 2, err
    assert_clean(code, err)
    assert "--ray 'bogus://x': bogus scheme is not Ray's" in err
    assert not (tmp_path / "r").exists()


@needs_ray
@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_a_closed_port_is_one_line_and_ray_never_connects(tmp_path, scheme):
    port = closed_port()
    code, out, err = run_cli("sweep", "--url", "http://127.0.0.1:9", "--workers", "2", "--ray",
                                 f"{scheme}127.0.0.1:{port}", "--output", tmp_path / "r")
    assert code == 2, err
    assert_clean(code, err)  # one line: none of Ray's retries
    assert f"nothing answers at 127.0.0.1:{port}" in err
    assert not (tmp_path / "r").exists()
    import ray

    assert not ray.is_initialized()


@needs_ray
def test_a_head_that_never_answers_is_a_connect_timeout(full_backlog):
    import ray

    with pytest.raises(ConfigError, match=f"no answer from 127.0.0.1:{full_backlog} within 0.3 s") as caught:
        reach_ray(f"127.0.0.1:{full_backlog}", ray, timeout_s=0.3)
    assert "\n" not in str(caught.value)


@needs_ray
def test_auto_without_a_cluster_is_one_line(tmp_path, monkeypatch):
    """RAY_ADDRESS is what `auto` finds first: a closed port there is checked like one given."""
    port = closed_port()
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    code, _, err = run_cli("sweep", "--url", "http://127.0.0.1:9", "--workers", "2", "--ray", "auto",
                               "--output", tmp_path / "r")
    assert code == 2, err
    assert_clean(code, err)
    assert "--ray auto: nothing answers at" in err


@FUZZ
@given(scheme=st.sampled_from(["", "ray://", "bogus://", "http://", "RAY://", "ray:/"]),
       host=st.sampled_from(["127.0.0.1", "localhost", "[::1]", "", "::1"]),
       port=st.sampled_from(["{closed}", "0", "65536", "", "x", "-1"]))
def test_any_loopback_address_on_the_command_line_is_one_line(tmp_path_factory, scheme, host, port):
    """Only loopback hosts and closed ports: whatever is not refused outright finds nothing answering."""
    if not HAVE_RAY:
        pytest.skip("Ray is not installed")
    address = f"{scheme}{host}:{port.format(closed=closed_port())}"
    out = tmp_path_factory.mktemp("ray") / "r"
    code, _, err = run_cli("sweep", "--url", "http://127.0.0.1:9", "--workers", "2", "--ray", address,
                               "--output", out)
    assert code == 2, err
    assert_clean(code, err)
    assert not out.exists()
