"""Apple Silicon's CPU, GPU and ANE power from `powermetrics`, turned into energy counters.

powermetrics needs root. `power_meter` finds how to run it: as loadgen itself when loadgen runs as
root, else through `sudo -n` when sudo lets it run without a password; otherwise there is no meter
and one line (`ROOT_NOTE`) says how to get one. Each reading runs it for one short window
(`-i WINDOW_MS -n 1`) and parses its powers (client/mac_facts.py `parse_powermetrics`); `PowerMeter`
integrates them over the time between readings (trapezoid) into joules since its first reading, so
that a sample's `mac_energy` is a counter as Linux's RAPL `energy_uj` is (analysis/energy.py).
"""

from __future__ import annotations

import os
import threading

from ..core.environment import MacEnergy
from .mac_facts import Run, parse_powermetrics, run_tool

WINDOW_MS = 200
POWERMETRICS = ["powermetrics", "--samplers", "cpu_power,gpu_power,ane_power", "-i", str(WINDOW_MS), "-n", "1"]
ROOT_NOTE = ("powermetrics needs root: run loadgen with sudo, or allow `sudo -n powermetrics`; "
             "energy per token is not measured")
SOURCES = ("cpu", "gpu", "ane")


class PowerMeter:
    """Readings of powermetrics (`argv`) with the joules since the first one; thread-safe (a run's
    targets are sampled from several threads)."""

    def __init__(self, argv: list[str], run: Run = run_tool):
        self.argv, self.run = argv, run
        self._lock = threading.Lock()
        self._last: tuple[float, dict[str, float]] | None = None
        self._joules: dict[str, float] = {}

    def read(self, at_s: float) -> MacEnergy | None:
        """The powers now and the energy up to `at_s` (seconds on the run's clock); None when
        powermetrics printed no power this time."""
        powers = parse_powermetrics(self.run(self.argv) or "")
        if not powers:
            return None
        with self._lock:
            self._add(at_s, powers)
            joules = dict(self._joules)
        return MacEnergy(**powers, **{f"{s}_j": round(joules[s], 9) for s in SOURCES if s in joules})

    def _add(self, at_s: float, powers: dict[str, float]) -> None:
        if self._last is not None and at_s <= self._last[0]:
            return  # a reading that finished after a later one: its moment is already counted
        seconds = at_s - self._last[0] if self._last is not None else 0.0
        before = self._last[1] if self._last is not None else {}
        for source in SOURCES:
            now = powers.get(f"{source}_mw")
            if now is None:
                continue
            then = before.get(f"{source}_mw", now)
            self._joules[source] = self._joules.get(source, 0.0) + (then + now) / 2 / 1000 * seconds
        self._last = (at_s, powers)


def power_meter(run: Run = run_tool, euid: int | None = None) -> tuple[PowerMeter | None, str | None]:
    """(a meter, None) when powermetrics gives a power reading as root or through `sudo -n`, else
    (None, the one line saying why and how to enable it)."""
    root = (os.geteuid() if euid is None else euid) == 0
    argv = POWERMETRICS if root else ["sudo", "-n", *POWERMETRICS]
    if parse_powermetrics(run(argv) or ""):
        return PowerMeter(argv, run), None
    if root:
        return None, "powermetrics gave no power reading (is it an Apple Silicon Mac?); energy per token is not measured"
    return None, ROOT_NOTE


def power_line(run: Run = run_tool) -> str:
    """`loadgen env`'s line for Apple Silicon's power now: "power draw: CPU 1234 mW, GPU 56 mW, ANE 0 mW
    (powermetrics)", or why there is none (`ROOT_NOTE`)."""
    meter, note = power_meter(run)
    reading = meter.read(0.0) if meter is not None else None
    if reading is None:
        return f"power draw: {note or 'powermetrics gave no power reading'}"
    parts = [f"{name} {mw:g} mW" for name, mw in (("CPU", reading.cpu_mw), ("GPU", reading.gpu_mw),
                                                  ("ANE", reading.ane_mw)) if mw is not None]
    return f"power draw: {', '.join(parts)} (powermetrics)"
