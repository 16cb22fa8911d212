"""What only Linux offers degrades to a stated fallback elsewhere (macOS), tested on Linux by
switching each facility off: the platform, /proc, lsof, the kernel's parent-death signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loadgen.cli.env import linux_only_note
from loadgen.client import connections, mac_facts
from loadgen.core import ports, processes
from loadgen.core.processes import parent_death_signal_available, pid_alive, watchdog_argv
from loadgen.run import servers
from test_transport_fast import ThreadedServer, llama_like

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _darwin(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")


# ---------------------------------------------------------------- kernel receive stamps -> the loop's clock

def test_no_rx_stamps_off_linux(monkeypatch):
    import socket
    with socket.socket() as sock:
        assert connections.enable_rx_stamps(sock) is (sys.platform == "linux")
    _darwin(monkeypatch)
    with socket.socket() as sock:
        assert connections.enable_rx_stamps(sock) is False


def test_a_sweep_off_linux_says_its_reads_were_timed_by_the_loop(loadgen, tmp_path, monkeypatch):
    from loadgen.results.reader import load_run_dict

    _darwin(monkeypatch)
    with ThreadedServer(llama_like) as server:
        code, _, err = loadgen("sweep", "--url", server.url, "--concurrency", "1", "--requests", "2", "--warmup", "0",
                               "--transport", "fast", "--no-histograms", "--wait-ready", "1",
                               "--output", tmp_path / "run")
    assert code == 0, err
    assert load_run_dict(tmp_path / "run")["targets"][0]["read_clock"] == "loop"


# ---------------------------------------------------------------- port ownership without /proc/net/tcp

LSOF = """p501
f7
n127.0.0.1:8080
p502
f9
n*:8080
f10
n[::1]:8081
p503
f4
n127.0.0.1:50000->127.0.0.1:8080
"""


def test_lsof_listeners_are_parsed():
    assert ports.parse_lsof_listeners(LSOF) == [(501, "127.0.0.1", 8080), (502, "0.0.0.0", 8080),
                                                (502, "::1", 8081)]


@pytest.mark.parametrize("output,sessions,expected", [
    ("p501\nf7\nn127.0.0.1:8080\n", {501: 77}, "ours"),
    ("p501\nf7\nn127.0.0.1:8080\np502\nf3\nn*:8080\n", {501: 77, 502: 77}, "ours"),
    ("p501\nf7\nn127.0.0.1:8080\np502\nf3\nn*:8080\n", {501: 77, 502: 12}, "foreign"),
    ("p502\nf3\nn127.0.0.2:8080\n", {502: 12}, None),  # listens elsewhere: takes no connections to 127.0.0.1
    ("", {}, None),  # nothing seen: lsof may not show another user's socket, so no "none"
])
def test_lsof_holder(monkeypatch, output, sessions, expected):
    monkeypatch.setattr(ports.shutil, "which", lambda name: "/usr/sbin/lsof")
    monkeypatch.setattr(ports, "_session_id", sessions.get)
    seen = []

    def run(argv, **kw):
        seen.append(argv)
        return subprocess.CompletedProcess(argv, 0, output, "")
    assert ports.lsof_holder("127.0.0.1", 8080, 77, run=run) == expected
    assert seen == [["lsof", "-nP", "-iTCP:8080", "-sTCP:LISTEN", "-F", "pn"]]


def test_without_lsof_nobody_can_tell(monkeypatch):
    monkeypatch.setattr(ports.shutil, "which", lambda name: None)
    assert ports.lsof_holder("127.0.0.1", 8080, 77) is None


def test_port_holder_without_proc_net_tcp_asks_lsof(monkeypatch, tmp_path):
    monkeypatch.setattr(ports, "lsof_holder", lambda host, port, session: ("lsof", host, port, session))
    assert ports.port_holder("127.0.0.1", 8080, 77, proc=tmp_path) == ("lsof", "127.0.0.1", 8080, 77)


@pytest.mark.parametrize("has_tcp,lsof,expected", [
    (True, True, "the kernel's socket table (/proc/net/tcp)"),
    (False, True, "lsof (no /proc/net/tcp here; it sees other users' sockets only as root)"),
    (False, False, "the server's /props slot count alone (no /proc/net/tcp, no lsof here)"),
])
def test_the_ownership_check_is_named(monkeypatch, tmp_path, has_tcp, lsof, expected):
    if has_tcp:
        (tmp_path / "net").mkdir()
        (tmp_path / "net" / "tcp").write_text("")
    monkeypatch.setattr(ports.shutil, "which", lambda name: "/usr/sbin/lsof" if lsof else None)
    assert ports.ownership_check(tmp_path) == expected


def test_the_grid_names_its_fallbacks(monkeypatch, tmp_path):
    (tmp_path / "net").mkdir()
    (tmp_path / "net" / "tcp").write_text("")
    if sys.platform == "linux":
        assert servers.fallback_notes(tmp_path) == []
    _darwin(monkeypatch)
    monkeypatch.setattr(ports.shutil, "which", lambda name: None)
    notes = servers.fallback_notes(tmp_path / "absent")
    assert notes == ["no parent-death signal on this system: each server runs under loadgen's watchdog, "
                     "which ends it when loadgen exits",
                     "who holds a server's port is told by the server's /props slot count alone "
                     "(no /proc/net/tcp, no lsof here)"]


# ---------------------------------------------------------------- no parent-death signal -> the watchdog

@pytest.mark.parametrize("platform,expected", [("linux", True), ("darwin", False), ("freebsd14", False),
                                               ("win32", False)])
def test_parent_death_signal_only_on_linux(monkeypatch, platform, expected):
    monkeypatch.setattr(sys, "platform", platform)
    assert parent_death_signal_available() is expected


def test_die_with_parent_without_prctl_is_harmless(monkeypatch):
    import ctypes

    class NoPrctl:
        def __init__(self, *a, **kw):
            pass
    monkeypatch.setattr(ctypes, "CDLL", NoPrctl)  # a libc with no prctl, as macOS's
    processes.die_with_parent()()  # no AttributeError


def _child_pid(wrapper: subprocess.Popen, timeout_s: float = 10) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = subprocess.run(["pgrep", "-P", str(wrapper.pid)], capture_output=True, text=True).stdout.split()
        if found:
            return int(found[0])
        time.sleep(0.05)
    raise AssertionError("the watchdog started no child")


def _gone_within(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid) or _zombie(pid):
            return True
        time.sleep(0.05)
    return False


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return False


def _env():
    return {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}


def test_the_watchdog_kills_its_child_when_the_pipe_closes():
    wrapper = subprocess.Popen(watchdog_argv(["sleep", "60"]), stdin=subprocess.PIPE, start_new_session=True,
                               env=_env())
    sleeper = None
    try:
        sleeper = _child_pid(wrapper)
        assert pid_alive(sleeper)
        wrapper.stdin.close()  # loadgen exited
        assert _gone_within(sleeper, 5), "the sleep outlived the pipe"
        assert wrapper.wait(timeout=5) == -signal.SIGTERM  # the server's end, mirrored
    finally:
        for pid in (sleeper, wrapper.pid):
            if pid is not None and pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
        wrapper.wait(timeout=5)


def test_the_watchdog_reports_its_childs_exit():
    wrapper = subprocess.Popen(watchdog_argv([sys.executable, "-c", "import sys; sys.exit(3)"]),
                               stdin=subprocess.PIPE, start_new_session=True, env=_env())
    try:
        assert wrapper.wait(timeout=10) == 3
    finally:
        if wrapper.poll() is None:
            wrapper.kill()


def test_a_server_launched_off_linux_runs_under_the_watchdog_and_stops(monkeypatch, tmp_path):
    _darwin(monkeypatch)
    monkeypatch.setenv("PYTHONPATH", _env()["PYTHONPATH"])
    server = servers.launch(["sleep", "60"], "http://127.0.0.1:1", tmp_path / "server.log")
    try:
        assert server.proc.args[:4] == [sys.executable, "-m", "loadgen.core.watchdog", "--"]
        sleeper = _child_pid(server.proc)
        assert os.getsid(sleeper) == server.pid  # the group `stop` signals holds the server
        servers.stop(server)
        assert _gone_within(sleeper, 5)
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait(timeout=5)
    assert "loadgen's watchdog" in (tmp_path / "server.log").read_text()


def test_a_missing_program_off_linux_is_a_start_error(monkeypatch, tmp_path):
    _darwin(monkeypatch)
    with pytest.raises(servers.ServerStartError, match="could not run no-such-server-xyz"):
        servers.launch(["no-such-server-xyz"], "http://127.0.0.1:1", tmp_path / "server.log")


# ---------------------------------------------------------------- the machine readers without /proc and /sys

@pytest.mark.parametrize("sysfs,procfs,expected", [
    (True, True, None),
    (False, False, "darwin: no /proc or /sys here; what is shown above is what could be read, and the rest "
                   "(CPU frequency and governor, RAPL power, hwmon temperatures, steal time, PCIe links) is "
                   "Linux-only"),
    (False, True, "darwin: no /sys here; what is shown above is what could be read, and the rest "
                  "(CPU frequency and governor, RAPL power, hwmon temperatures, steal time, PCIe links) is "
                  "Linux-only"),
])
def test_linux_only_note(sysfs, procfs, expected):
    assert linux_only_note("darwin", sysfs, procfs) == expected


def test_env_off_linux_without_proc_and_sys_prints_what_it_read(loadgen, monkeypatch, tmp_path):
    _darwin(monkeypatch)
    real_is_dir = Path.is_dir
    monkeypatch.setattr(Path, "is_dir", lambda p: False if str(p) in ("/proc", "/sys") else real_is_dir(p))
    code, out, err = loadgen("env", "--interval", "0")
    assert code == 0, err
    assert "Traceback" not in out + err
    assert "CPU:" in out and "memory:" in out
    assert "darwin: no /proc or /sys here" in out


def test_env_on_linux_still_refuses_a_missing_tree(loadgen, monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    code, _, err = loadgen("env", "--procfs", "/no/such/proc", "--interval", "0")
    assert code != 0 and "--procfs /no/such/proc: no such directory" in err


# ---------------------------------------------------------------- a server's resident memory without /proc

@pytest.mark.parametrize("text,expected", [("  2048\n", 2.0), ("1536", 1.5), ("", None), ("RSS\n", None),
                                           ("12 34", None)])
def test_ps_rss_is_parsed(text, expected):
    from loadgen.kinds.cache_capacity.command import parse_ps_rss_mib
    assert parse_ps_rss_mib(text) == expected


def test_rss_without_proc_is_read_by_ps(tmp_path):
    from loadgen.kinds.cache_capacity.command import _rss_mib
    with_proc = _rss_mib(os.getpid())
    without = _rss_mib(os.getpid(), proc=tmp_path)  # no /proc here: ps answers
    assert without is not None and without > 1
    if with_proc is not None:
        assert abs(without - with_proc) < max(64, with_proc * 0.5)


def test_the_machine_readers_without_proc_and_sys_report_unknowns(tmp_path):
    from loadgen.client.machine_facts import MachineReader, Roots

    reader = MachineReader(Roots(tmp_path / "no-sys", tmp_path / "no-proc"))
    fp = reader.fingerprint()
    sample = reader.sample(0.0)
    assert not fp.cpu.logical_cores and fp.cpu.model is None and fp.kernel is None  # 0 cores: unknown
    assert sample.rapl == () and sample.temperatures == ()


def test_usable_cores_without_sched_getaffinity(monkeypatch):
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 10)
    assert processes.usable_cores() == 10


# ---------------------------------------------------------------- the Mac's own tools (sample outputs in Apple's formats)

SYSCTL = """machdep.cpu.brand_string: Apple M1 Max
hw.perflevel0.physicalcpu: 8
hw.perflevel1.physicalcpu: 2
hw.logicalcpu: 10
hw.memsize: 68719476736
vm.swapusage: total = 2048.00M  used = 1024.50M  free = 1023.50M  (encrypted)
"""
SW_VERS = "ProductName:\t\tmacOS\nProductVersion:\t\t14.5\nBuildVersion:\t\t23F79\n"
PMSET = """System-wide power settings:
Currently in use:
 standby              1
 Sleep On Power Button 1
 hibernatefile        /var/vm/sleepimage
 powernap             1
 lowpowermode         1
 sleep                1 (sleep prevented by powerd)
"""
PMSET_PS = "Now drawing from 'AC Power'\n"
THERM_NONE = """Note: No thermal warning level has been recorded
Note: No performance warning level has been recorded
Note: No CPU power status has been recorded
"""
THERM_LIMITED = """Note: No thermal warning level has been recorded
Note: No performance warning level has been recorded
2026-12-05 16:30:01 +0000 CPU Power notify
\tCPU_Scheduler_Limit \t= 100
\tCPU_Available_CPUs \t= 10
\tCPU_Speed_Limit \t= 70
"""
VM_STAT = """Mach Virtual Memory Statistics: (page size of 16384 bytes)
Pages free:                               12345.
Pages active:                            400000.
"Translation faults":                  99999999.
Swapins:                                    10.
"""


def test_sysctl_and_swapusage():
    ctl = mac_facts.parse_sysctl(SYSCTL)
    assert ctl["machdep.cpu.brand_string"] == "Apple M1 Max" and ctl["hw.memsize"] == "68719476736"
    assert mac_facts.parse_swapusage(ctl["vm.swapusage"]) == (2048.0, 1024.5)
    assert mac_facts.parse_swapusage("total = 1.50G  used = 512.00K  free = 1.50G") == (1536.0, 0.5)


@pytest.mark.parametrize("text,expected", [
    (SW_VERS, "macOS 14.5 (23F79)"),
    ("ProductName:\tMac OS X\nProductVersion:\t10.15.7\n", "Mac OS X 10.15.7"),
    ("", None),
])
def test_sw_vers(text, expected):
    assert mac_facts.parse_sw_vers(text) == expected


@pytest.mark.parametrize("text,expected", [(PMSET, True), (PMSET.replace("lowpowermode         1",
                                                                          "lowpowermode         0"), False),
                                           ("Currently in use:\n sleep 1\n", None)])
def test_low_power_mode(text, expected):
    assert mac_facts.parse_low_power_mode(text) is expected


@pytest.mark.parametrize("text,expected", [
    (PMSET_PS, "AC Power"),
    ("Now drawing from 'Battery Power'\n -InternalBattery-0 (id=1234)\t85%; discharging; 5:12 remaining\n",
     "Battery Power"),
    ("", None),
])
def test_power_source(text, expected):
    assert mac_facts.parse_power_source(text) == expected


@pytest.mark.parametrize("text,expected", [
    (THERM_NONE, (100, None)),  # no CPU power status recorded: macOS never limited the CPU
    ("Note: No thermal warning level has been recorded\n", (None, None)),
    (THERM_LIMITED, (70, None)),
    ("Thermal warning level set to 2.\n\tCPU_Speed_Limit \t= 50\n", (50, "Thermal warning level set to 2.")),
])
def test_therm(text, expected):
    assert mac_facts.parse_therm(text) == expected


def test_vm_stat():
    counts = mac_facts.parse_vm_stat(VM_STAT)
    assert counts == {"Pages free": 12345 * 16384, "Pages active": 400000 * 16384,
                      "Translation faults": 99999999, "Swapins": 10}


def _fake_tools(argv):
    return {("sysctl",): SYSCTL, ("sw_vers",): SW_VERS, ("pmset", "-g"): PMSET, ("pmset", "-g", "ps"): PMSET_PS,
            ("pmset", "-g", "therm"): THERM_LIMITED, ("vm_stat",): VM_STAT}.get(
        tuple(argv[:1]) if argv[0] == "sysctl" else tuple(argv))


def test_the_field_reports_mac():
    facts = mac_facts.read_mac_facts(_fake_tools)
    assert facts.summary() == "Apple M1 Max, 10 cores (8 performance + 2 efficiency), 64 GiB unified memory"
    assert mac_facts.mac_lines(facts) == [
        "Mac: Apple M1 Max, 10 cores (8 performance + 2 efficiency), 64 GiB unified memory",
        "OS: macOS 14.5 (23F79)",
        "power: AC Power, Low Power Mode on",
        "thermal: no thermal warning recorded; CPU speed limit 70%",
        "swap: 2048 MiB, 1024.5 MiB used"]


def test_no_mac_tools_leave_unknowns():
    facts = mac_facts.read_mac_facts(lambda argv: None)
    assert facts == mac_facts.MacFacts()
    assert mac_facts.mac_lines(facts)[:3] == ["Mac: unknown chip", "OS: unknown",
                                              "power: unknown power source, Low Power Mode unknown"]


def test_env_on_a_mac_prints_the_mac(loadgen, monkeypatch):
    _darwin(monkeypatch)
    monkeypatch.setattr("loadgen.cli.env.read_mac_facts", lambda: mac_facts.read_mac_facts(_fake_tools))
    code, out, err = loadgen("env", "--interval", "0")
    assert code == 0, err
    assert "Mac: Apple M1 Max, 10 cores (8 performance + 2 efficiency), 64 GiB unified memory" in out
    assert "power: AC Power, Low Power Mode on" in out


# ---------------------------------------------------------------- a SIGKILLed grid leaves no server, without PR_SET_PDEATHSIG



def _children(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in found]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="finds the processes through /proc")
def test_a_sigkilled_grid_leaves_no_server_behind_without_the_parent_death_signal(tmp_path):
    from servers import GRID_SERVER

    # LOADGEN_LINUX_FACILITIES=off: no parent-death signal, as on a Mac (core/facilities.py)
    grid = subprocess.Popen([sys.executable, "-m", "loadgen", "grid", "--server",
                             f"{GRID_SERVER} --parallel {{parallel}}", "--param", "parallel=1", "--measure", "sweep",
                             "--output", str(tmp_path / "grid"), "--", "--concurrency", "1", "--requests", "100000",
                             "--n-predict", "8", "--warmup", "0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**_env(), "LOADGEN_LINUX_FACILITIES": "off"}, start_new_session=True)
    server = sweep = None
    try:
        deadline = time.monotonic() + 60
        while (server is None or sweep is None) and time.monotonic() < deadline:
            for wrapper in _children(grid.pid):
                if "loadgen.core.watchdog" in _cmdline(wrapper):
                    server = server or next((p for p in _children(wrapper) if "fake-llama-server" in _cmdline(p)), None)
                    sweep = sweep or next((p for p in _children(wrapper) if "loadgen.cli sweep" in _cmdline(p)), None)
            time.sleep(0.1)
        assert server is not None, "the grid started no server under the watchdog"
        assert sweep is not None, "the grid's measurement does not run under the watchdog"
        os.kill(grid.pid, signal.SIGKILL)
        grid.wait(timeout=5)
        assert _gone_within(server, 15), "the server outlived its SIGKILLed grid"
        assert _gone_within(sweep, 15), "the measurement outlived its SIGKILLed grid"
    finally:
        if grid.poll() is None:
            grid.kill()
            grid.wait(timeout=5)
        for pid in [p for p in (server, sweep) if p]:
            if pid_alive(pid) and not _zombie(pid):
                os.kill(pid, signal.SIGKILL)


def test_env_json_on_a_mac_carries_the_mac(loadgen, monkeypatch):
    import json

    _darwin(monkeypatch)
    monkeypatch.setattr("loadgen.cli.env.read_mac_facts", lambda: mac_facts.read_mac_facts(_fake_tools))
    code, out, err = loadgen("env", "--interval", "0", "--format", "json")
    assert code == 0, err
    mac = json.loads(out)["mac"]
    assert (mac["chip"], mac["performance_cores"], mac["efficiency_cores"], mac["low_power_mode"]) == \
        ("Apple M1 Max", 8, 2, True)
