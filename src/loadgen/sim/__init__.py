"""A simulated llama-server: the real HTTP API, slots, continuous batching and faults, on a timing
model calibrated from field reports (profiles in `loadgen/profiles/*.toml`).

    async with await start_simulator(load_profile("smoke"), slots=2, time_scale=0.1) as sim:
        ...  # talk to sim.url as to a llama-server
"""

from .faults import FAULT_KINDS, FaultConfig, FaultKind, FaultRule, parse_fault
from .profile import Profile, builtin_profiles, load_profile
from .server import RunningSimulator, start_simulator

__all__ = [
    "FAULT_KINDS", "FaultConfig", "FaultKind", "FaultRule", "Profile", "RunningSimulator", "builtin_profiles",
    "load_profile", "parse_fault", "start_simulator",
]
