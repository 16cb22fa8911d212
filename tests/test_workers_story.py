"""The worker count told once (issue 39): `--workers 9` on 2 cores ran 8 processes and then told
each of them, in 8 lines, to use more worker processes. Expected lines written first."""

from __future__ import annotations

import pytest

from loadgen.run.looplag import ClientLoad, workers_warning

LAG = ClientLoad(loop_lag_p99_ms=12.0, loop_lag_max_ms=20.0, client_cpu_fraction=0.1, samples=0)
CALM = ClientLoad(loop_lag_p99_ms=0.5, loop_lag_max_ms=1.0, client_cpu_fraction=0.1, samples=0)

# (the workers' loads, cores) -> the one line (None: none)
CASES = [
    ([CALM, CALM], 2, None),
    ([LAG, CALM], 2, "1 of 2 workers: the client may be the bottleneck (event-loop lag p99 12.00 ms > 2 ms)"),
    ([LAG] * 8, 2, "8 of 8 workers: the client may be the bottleneck"),
]


@pytest.mark.parametrize("loads, cores, expected", CASES)
def test_one_line_for_every_worker(loads, cores, expected):
    line = workers_warning(loads, cores)
    if expected is None:
        assert line is None
    else:
        assert line.startswith(expected) and line.count("bottleneck") == 1


def test_more_processes_than_cores_are_told_to_use_fewer():
    line = workers_warning([LAG] * 8, 2)
    assert "8 processes share 2 cores" in line and "--workers 2" in line and "more worker processes" not in line
    line = workers_warning([LAG, CALM], 2)
    assert "more worker processes" in line


def test_workers_beyond_the_cores_are_told_once(simulator, tmp_path):
    """`--workers 9` (8 processes: the level has 8 in flight): one line on the processes (and, on a
    machine of fewer cores, that they share them), and one warning line per lagging level at most."""
    import subprocess

    from servers import LOADGEN

    proc = subprocess.run([*LOADGEN, "sweep", "--url", simulator, "--workers", "9", "--concurrency", "8",
                           "--requests", "16", "--n-predict", "4", "--warmup", "0", "--output", str(tmp_path / "r")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert sum("--workers 9" in line for line in lines) == 1
    assert sum("bottleneck" in line for line in lines) <= 1
    assert not any("worker 0:" in line for line in lines)
