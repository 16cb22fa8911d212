"""Is the server that answers on a grid cell's port the one the cell started? Pure rules over the facts.

The facts are gathered by the grid (`run.servers`, `core.ports`): who holds the port's listening
sockets ("ours": only the cell's server's processes; "foreign": another process too, including a
second server sharing it through SO_REUSEPORT; "none"; None where the system cannot tell), whether
the cell's server still runs, and how many slots the answering server's /props reports against the
cell's --parallel. A cell measures only its own server: anything else is a failed cell whose reason
says so in one line, never a measurement of someone else's server.
"""

from __future__ import annotations

from typing import Any


def bind_failure(address: str, problem: str = "in use") -> str:
    """The reason of a cell whose server could not have (or keep) its port: "could not bind 127.0.0.1:8080 (in use)"."""
    return f"could not bind {address} ({problem})"


def asked_slots(parallel: str | None) -> int | None:
    """The cell's --parallel as a slot count (None when unset, auto (-1) or not a number)."""
    try:
        n = int(parallel) if parallel is not None else 0
    except ValueError:
        return None
    return n if n > 0 else None


def not_the_cells_server(address: str, holder: str | None, running: bool, reported_slots: Any,
                         parallel: int | None) -> str | None:
    """Why what answered on `address` is not the cell's own server, or None when nothing says so.

    A foreign listener fails the cell whatever else is true (its server could not bind, or shares
    the port with another). A server that exited is reported by whoever saw the exit (None here).
    Where the system cannot tell who listens (`holder` None), the /props slot count is the evidence
    left: a server reporting other slots than the cell's --parallel is not the cell's.
    """
    if holder == "foreign":
        return bind_failure(address)
    if not running:
        return None
    if holder == "none":
        return f"/health answered but nothing listens on {address} now; not measured"
    if parallel is not None and isinstance(reported_slots, int) and reported_slots != parallel:
        return (f"the server answering on {address} reports {reported_slots} slots, the cell's --parallel is "
                f"{parallel}: not the cell's server; not measured")
    return None
