"""Is a TCP port free, and does a process group of ours hold it (Linux: /proc/net/tcp and /proc/PID/fd).

A grid cell's server must be the one that answers on its port, and two checks make sure:

- `bind_problem(host, port)` binds the port as a server would (SO_REUSEADDR, so a closed
  connection's TIME_WAIT does not count, as it does not for the server) and closes it again: any
  socket listening there makes it fail, whatever options that socket has.
- `port_holder(host, port, session)` reads the kernel's table of listening sockets and the file
  descriptors of the processes in `session`: "ours" when every socket that takes connections to
  host:port belongs to them, "foreign" when one belongs to another process, "none" when nothing
  listens there, None where /proc cannot tell (another system, or fds we may not read).
  Without /proc/net/tcp (macOS, BSD) `lsof -nP -iTCP:PORT -sTCP:LISTEN` is asked when installed:
  a listener of another session there is "foreign", ours alone "ours"; nothing seen is None, not
  "none", since lsof shows other users' sockets only to root. Where neither tells, the grid's
  /props slot check is the evidence left (`analysis.server_ownership`); `ownership_check` names
  which of the three this system uses.

Why the socket table rather than what the server says about itself: llama-server's HTTP library
listens with SO_REUSEPORT, so a second llama-server of the same user binds a taken port without an
error and the kernel shares the connections between the two; a /health or /props answer then comes
from either, and a server that is alive proves nothing about who answered. Only the listening
sockets and their owners tell.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .facilities import linux_facilities

PortHolder = Literal["ours", "foreign", "none"]
LISTEN = "0A"  # the TCP state column of /proc/net/tcp


def bind_problem(host: str, port: int) -> str | None:
    """None when `host:port` can be bound now, else why not ("in use", or the system's words)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return "in use"
        return (exc.strerror or str(exc)).lower()
    return None


@dataclass(frozen=True)
class Listener:
    """One listening TCP socket of the kernel's table: its local address, port and inode."""
    address: str
    port: int
    inode: int


def parse_proc_net_tcp(text: str) -> list[Listener]:
    """The listening sockets of a /proc/net/tcp or /proc/net/tcp6 table (addresses as the kernel
    writes them: hex, each 32-bit word in host byte order)."""
    found = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != LISTEN:
            continue
        hex_address, _, hex_port = fields[1].partition(":")
        try:
            raw = b"".join(bytes.fromhex(hex_address[i:i + 8])[::-1] for i in range(0, len(hex_address), 8))
            found.append(Listener(str(ipaddress.ip_address(raw)), int(hex_port, 16), int(fields[9])))
        except ValueError:
            continue
    return found


def takes_connections_to(listener: Listener, host_addresses: set[str]) -> bool:
    """Would a connection to one of `host_addresses` (empty: any address) reach this listener?"""
    address = ipaddress.ip_address(listener.address)
    if address.is_unspecified or not host_addresses:
        return True
    mapped = getattr(address, "ipv4_mapped", None)
    return listener.address in host_addresses or (mapped is not None and str(mapped) in host_addresses)


def holder(listeners: list[Listener], ours: set[int]) -> PortHolder:
    """Who holds a port, given its listeners (those that take the connections) and our socket inodes."""
    if not listeners:
        return "none"
    return "ours" if all(listener.inode in ours for listener in listeners) else "foreign"


def port_holder(host: str, port: int, session: int, proc: Path = Path("/proc")) -> PortHolder | None:
    """Who listens on host:port: the processes of `session` alone ("ours"), another process too
    ("foreign"), nobody ("none"); None where /proc cannot tell."""
    tables = []
    for name in ("tcp", "tcp6") if linux_facilities() else ():
        try:
            tables.append((proc / "net" / name).read_text())
        except FileNotFoundError:
            continue
        except OSError:
            return None
    if not tables:
        return lsof_holder(host, port, session)
    addresses = _addresses(host)
    listeners = [listener for text in tables for listener in parse_proc_net_tcp(text)
                 if listener.port == port and takes_connections_to(listener, addresses)]
    ours = session_socket_inodes(session, proc)
    return None if ours is None else holder(listeners, ours)


def session_socket_inodes(session: int, proc: Path = Path("/proc")) -> set[int] | None:
    """The inodes of every socket the processes of `session` hold open; None when one of their fd
    tables cannot be read (another user's process)."""
    inodes: set[int] = set()
    for entry in proc.iterdir():
        if not entry.name.isdigit() or _session_of(entry) != session:
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except FileNotFoundError:
            continue  # it exited meanwhile
        except OSError:
            return None
        for fd in fds:
            try:
                link = os.readlink(fd)
            except OSError:
                continue  # closed meanwhile
            if link.startswith("socket:["):
                inodes.add(int(link[8:-1]))
    return inodes


def _session_of(entry: Path) -> int | None:
    try:
        stat = (entry / "stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # after "pid (comm)": state ppid pgrp session ...
    return int(fields[3]) if len(fields) > 3 else None


def _addresses(host: str) -> set[str]:
    """The addresses `host` names (empty for a wildcard or a name that does not resolve: any)."""
    try:
        found = {str(info[4][0]) for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
    except OSError:
        return set()
    if any(ipaddress.ip_address(a.split("%")[0]).is_unspecified for a in found):
        return set()
    return {a.split("%")[0] for a in found}


def has_proc_net_tcp(proc: Path = Path("/proc")) -> bool:
    """Is the kernel's socket table there to read (Linux, unless LOADGEN_LINUX_FACILITIES=off)?"""
    return linux_facilities() and (proc / "net" / "tcp").exists()


def ownership_check(proc: Path = Path("/proc")) -> str:
    """Which evidence says who holds a port on this system, in words for the user."""
    if has_proc_net_tcp(proc):
        return "the kernel's socket table (/proc/net/tcp)"
    if shutil.which("lsof"):
        return "lsof (no /proc/net/tcp here; it sees other users' sockets only as root)"
    return "the server's /props slot count alone (no /proc/net/tcp, no lsof here)"


def parse_lsof_listeners(text: str) -> list[tuple[int, str, int]]:
    """(pid, address, port) of each listener in `lsof -nP -F pn` output: a "p<pid>" line starts a
    process, each "n<address>:<port>" line after it is one of its sockets ("*" is any address,
    "[::1]" an IPv6 one)."""
    found = []
    pid = None
    for line in text.splitlines():
        if line.startswith("p") and line[1:].isdigit():
            pid = int(line[1:])
        elif line.startswith("n") and pid is not None:
            address, _, port = line[1:].rpartition(":")
            if "->" in line or not port.isdigit():
                continue
            address = address.strip("[]")
            found.append((pid, "0.0.0.0" if address == "*" else address, int(port)))
    return found


def lsof_holder(host: str, port: int, session: int, run=subprocess.run) -> PortHolder | None:
    """Who listens on host:port by lsof: "foreign" when a process of another session does, "ours"
    when only `session`'s do, None when lsof is missing, fails or shows nobody (it may not show
    another user's sockets)."""
    if not shutil.which("lsof"):
        return None
    try:
        done = run(["lsof", "-nP", f"-iTCP:{port}", "-sTCP:LISTEN", "-F", "pn"],
                   capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    addresses = _addresses(host)
    pids = {pid for pid, address, p in parse_lsof_listeners(done.stdout)
            if p == port and takes_connections_to(Listener(address, p, 0), addresses)}
    if not pids:
        return None
    return "ours" if all(_session_id(pid) == session for pid in pids) else "foreign"


def _session_id(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None
