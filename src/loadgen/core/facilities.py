"""Linux-only facilities loadgen uses, and the one switch that turns them all off.

Three things loadgen takes from the Linux kernel, each with a stated fallback elsewhere (docs/macos.md):

* kernel receive stamps (SO_TIMESTAMPNS) on the client's sockets; else reads are timed on the loop's clock
  (client/connections.py `enable_rx_stamps`; run.json's `read_clock` says "loop");
* /proc/net/tcp, the kernel's table of listening sockets, for who holds a server's port; else `lsof`,
  else the server's /props slot count (core/ports.py);
* the parent-death signal (PR_SET_PDEATHSIG) that ends a child when loadgen dies; else the child runs
  under `core.watchdog` (core/processes.py).

`linux_facilities()` is the only place that decides whether they are used: on Linux, unless the
environment sets LOADGEN_LINUX_FACILITIES=off, so that a test run on Linux exercises the fallbacks a
Mac takes (docs/development.md, "Testing the fallbacks off Linux"). It is read at each call, not at import.
"""

from __future__ import annotations

import os
import sys

SWITCH = "LOADGEN_LINUX_FACILITIES"
OFF = ("off", "0", "no", "false")


def linux_facilities() -> bool:
    """Are Linux's kernel facilities used: on Linux, unless LOADGEN_LINUX_FACILITIES=off."""
    return sys.platform.startswith("linux") and os.environ.get(SWITCH, "").strip().lower() not in OFF
