"""A simulated llama-server: the real HTTP API, slots, continuous batching and faults, on a timing
model calibrated from field reports (profiles in `loadgen/profiles/*.toml`).

    async with await start_simulator(load_profile("smoke"), slots=2, time_scale=0.1) as sim:
        ...  # talk to sim.url as to a llama-server

The server (and with it aiohttp) is imported when `start_simulator` or `RunningSimulator` is first
asked for, so `loadgen sim --help` reads the profiles and fault kinds without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .faults import FAULT_KINDS, FaultConfig, FaultKind, FaultRule, parse_fault
from .profile import Profile, builtin_profiles, load_profile

if TYPE_CHECKING:
    from .server import RunningSimulator, start_simulator

_FROM_SERVER = ("RunningSimulator", "start_simulator")

__all__ = [
    "FAULT_KINDS", "FaultConfig", "FaultKind", "FaultRule", "Profile", "RunningSimulator", "builtin_profiles",
    "load_profile", "parse_fault", "start_simulator",
]


def __getattr__(name: str) -> Any:
    if name in _FROM_SERVER:
        from . import server

        return getattr(server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
