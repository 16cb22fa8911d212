"""LOADGEN_LINUX_FACILITIES=off (core/facilities.py) turns off all three Linux-only facilities at once:
kernel receive stamps, /proc/net/tcp and the parent-death signal, so a test run on Linux takes the
fallbacks a Mac takes (docs/development.md, "Testing the fallbacks off Linux"). And a child loadgen
starts other than a grid's server (here a bisect build) does not outlive a SIGKILLed loadgen without
the parent-death signal: it runs under the watchdog (core/processes.py `start_tied`)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from loadgen.client import connections
from loadgen.core import ports, processes
from loadgen.core.facilities import SWITCH
from loadgen.run import servers
from test_macos_fallbacks import _env, _gone_within, _zombie

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="switches Linux's facilities off")


def _facilities() -> tuple[bool, bool, bool]:
    with socket.socket() as sock:
        stamps = connections.enable_rx_stamps(sock)
    return stamps, ports.has_proc_net_tcp(), processes.parent_death_signal_available()


@pytest.mark.parametrize("value,expected", [(None, (True, True, True)), ("on", (True, True, True)),
                                            ("off", (False, False, False)), ("OFF", (False, False, False)),
                                            ("0", (False, False, False))])
def test_one_switch_turns_all_three_off(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv(SWITCH, raising=False)
    else:
        monkeypatch.setenv(SWITCH, value)
    assert _facilities() == expected
    if not expected[0]:
        asked = []
        monkeypatch.setattr(ports, "lsof_holder", lambda *a: asked.append(a))
        ports.port_holder("127.0.0.1", 8080, os.getsid(0))  # /proc/net/tcp is there, but not read
        assert asked == [("127.0.0.1", 8080, os.getsid(0))]
        assert len(servers.fallback_notes()) == 2  # the watchdog, and who tells a port's holder


def test_a_tied_child_under_the_watchdog_gets_the_signals_sent_to_it(monkeypatch):
    monkeypatch.setenv(SWITCH, "off")
    monkeypatch.setenv("PYTHONPATH", _env()["PYTHONPATH"])
    proc = processes.start_tied(["sleep", "60"])
    try:
        assert proc.watched and proc.args[:3] == [sys.executable, "-m", "loadgen.core.watchdog"]
        time.sleep(0.5)  # the watchdog has started its sleep
        proc.send_signal(signal.SIGTERM)  # to the group: the sleep ends, the watchdog ends as it did
        assert proc.wait(timeout=10) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


BISECT_BUILD = """
import sys
from pathlib import Path
from loadgen.cli.bisect import run_build
folder = Path(sys.argv[1])
run_build(f"echo $$ > {folder / 'pid'}; exec sleep 60", folder, folder / "build.log", 120)
"""


def test_a_bisect_build_does_not_outlive_a_sigkilled_loadgen_without_the_parent_death_signal(tmp_path):
    parent = subprocess.Popen([sys.executable, "-c", BISECT_BUILD, str(tmp_path)], env={**_env(), SWITCH: "off"},
                              start_new_session=True)
    build = None
    try:
        deadline = time.monotonic() + 20
        while build is None and time.monotonic() < deadline:
            text = (tmp_path / "pid").read_text().strip() if (tmp_path / "pid").exists() else ""
            build = int(text) if text else None
            time.sleep(0.05)
        assert build is not None, "the build never started"
        assert os.getsid(build) != os.getsid(parent.pid)  # under the watchdog, in a session of its own
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=5)
        assert _gone_within(build, 15), "the build outlived its SIGKILLed loadgen"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(timeout=5)
        if build is not None and processes.pid_alive(build) and not _zombie(build):
            os.kill(build, signal.SIGKILL)
