"""Load held: 10,000 requests at concurrency 512 against a simulated llama-server in its own process.

No client-side errors, every request recorded, open file descriptors back to where they were, and
the memory it took reported (never asserted: timings and sizes depend on the machine).
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from pathlib import Path

import pytest

from loadgen.cli.sweep import execute_sweep
from loadgen.client.backends import GenerationParams
from loadgen.results.reader import load_records, load_run_dict
from loadgen.run.config import SweepConfig, Target
from servers import SimProcess

REQUESTS = 10_000
CONCURRENCY = 512


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def fd_targets() -> dict[str, str]:
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            out[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass
    return out


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


class PeakRss:
    """The highest resident set size seen every 10 ms while inside `with`."""

    def __init__(self) -> None:
        self.peak = self.before = rss_kib()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, rss_kib())

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_kib())


@pytest.fixture
def big_sim():
    with SimProcess("--profile", "smoke", "--slots", str(CONCURRENCY), "--time-scale", "0.001", "--no-metrics") as sim:
        yield sim.url


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts descriptors in /proc")
def test_10000_requests_at_concurrency_512(big_sim, tmp_path, capsys):
    config = SweepConfig(targets=(Target(big_sim, "sim"),), concurrency=(CONCURRENCY,),
                         generation=GenerationParams(prompt="Hello", n_predict=4), requests_per_level=REQUESTS,
                         warmup=0, timeout_s=120, probe_interval_s=1.0)
    # A first small run pays the one-time costs: libuv's process-wide signal pipe (a pipe pair that
    # lives as long as the process), imports, caches. Descriptors are counted around the second.
    first = tmp_path / "first"
    first.mkdir()
    assert execute_sweep(dataclasses.replace(config, requests_per_level=100), first, histograms=False) == 0
    out = tmp_path / "run"
    out.mkdir()
    fds_before = open_fds()
    t_before = fd_targets()
    started = time.monotonic()
    with PeakRss() as rss:
        code = execute_sweep(config, out, histograms=False)
    elapsed = time.monotonic() - started
    fds_after = open_fds()
    capsys.readouterr()

    assert code == 0
    doc, records = load_run_dict(out), load_records(out)
    level = doc["targets"][0]["levels"][0]
    assert len(records) == REQUESTS and sorted(r.seq for r in records) == list(range(REQUESTS))
    assert level["requests_ok"] == REQUESTS and level["errors_by_kind"] == {}, level["errors_by_kind"]
    assert len({r.worker for r in records}) == CONCURRENCY
    t_after = fd_targets()
    assert fds_after == fds_before, {k: v for k, v in t_after.items() if t_before.get(k) != v}

    per_1000 = (rss.peak - rss.before) / (REQUESTS / 1000)
    with capsys.disabled():
        print(f"\nload: {REQUESTS} requests at c={CONCURRENCY} in {elapsed:.1f} s "
              f"({REQUESTS / elapsed:,.0f} req/s), 0 errors, records lost {REQUESTS - len(records)}; "
              f"fds {fds_before} before, {fds_after} after; RSS {rss.before / 1024:.0f} MiB before, "
              f"peak {rss.peak / 1024:.0f} MiB: +{per_1000 / 1024:.2f} MiB per 1,000 requests")
