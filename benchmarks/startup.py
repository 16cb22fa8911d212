"""How long `loadgen --help` and `loadgen <command> --help` take, each in a fresh interpreter (issue 47).

Every command of `loadgen.cli.main.COMMANDS` and the top-level `loadgen --help` are run `--rounds`
times as `python -m loadgen ... --help` (stdout to /dev/null, COLUMNS=100), the commands in an order
that rotates from round to round so that the machine's drift falls on all alike. Printed per command:
the best and the median wall time, and a mark where the best is over `--limit` (0.3 s, the issue's
target). `python -c pass` is timed the same way, as the floor no command can go below.

`--src` times another source tree (repeatable, one column each), e.g. the main branch's beside a
change's, in the same rounds:

    python benchmarks/startup.py                               # this tree's src/, 5 rounds (~1 min on 2 cores)
    python benchmarks/startup.py --rounds 3 --commands sweep,capacity,replay
    OLD=$(mktemp -d) && git archive main src | tar -x -C "$OLD"     # main's tree beside this one
    python benchmarks/startup.py --src "$OLD/src" --src src

Figures for the record: nothing asserts a timing (tests/test_startup.py asserts which libraries a
`--help` imports instead). With PYTHONDONTWRITEBYTECODE set, as on the development machine, loadgen's
own modules are compiled from source at every start, so the figures include that; the script says so.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOP = ""  # the row of `loadgen --help` itself
FLOOR = "(python -c pass)"


def commands(src: Path) -> list[str]:
    """The command names of the tree at `src`, read by the tree itself."""
    out = subprocess.run([sys.executable, "-c", "from loadgen.cli.main import COMMANDS; print(' '.join(COMMANDS))"],
                         capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(src)})
    return out.stdout.split()


def once(src: Path, command: str) -> float:
    """Seconds of one `python -m loadgen [command] --help` (or `python -c pass`) in a fresh process."""
    if command == FLOOR:
        argv = [sys.executable, "-c", "pass"]
    else:
        argv = [sys.executable, "-m", "loadgen", *([command] if command else []), "--help"]
    env = {**os.environ, "PYTHONPATH": str(src), "COLUMNS": "100"}
    start = time.perf_counter()
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv[1:])} failed ({proc.returncode}): {proc.stderr.decode()[-1000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="runs of each command (best and median of them)")
    parser.add_argument("--commands", help="comma-separated commands [default: every command]")
    parser.add_argument("--src", action="append", type=Path,
                        help="a source tree to time (repeatable) [default: this checkout's src/]")
    parser.add_argument("--limit", type=float, default=0.3, help="mark a best time above this many seconds")
    args = parser.parse_args()
    sources = [p.resolve() for p in (args.src or [ROOT / "src"])]
    names = args.commands.split(",") if args.commands else commands(sources[-1])
    rows = [FLOOR, TOP, *names]
    times: dict[tuple[int, str], list[float]] = {(i, r): [] for i in range(len(sources)) for r in rows}
    for n in range(args.rounds):
        order = rows[n % len(rows):] + rows[:n % len(rows)]
        for row in order:
            for i, src in enumerate(sources):
                times[i, row].append(once(src, row))
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, {args.rounds} rounds; "
          f"PYTHONDONTWRITEBYTECODE={'set: loadgen compiled at every start' if sys.dont_write_bytecode else 'unset'}")
    heads = "".join(f" | {src} best, median" for src in sources)
    print(f"| command{heads} |")
    print("| --- |" + " --- |" * len(sources))
    over = 0
    for row in rows:
        cells = []
        for i in range(len(sources)):
            best, median = min(times[i, row]), statistics.median(times[i, row])
            mark = " (over)" if row != FLOOR and best > args.limit else ""
            over += bool(mark) and i == len(sources) - 1
            cells.append(f"{best:.3f} s{mark}, {median:.3f} s")
        label = FLOOR if row == FLOOR else f"`loadgen {row + ' ' if row else ''}--help`"
        print(f"| {label} | " + " | ".join(cells) + " |")
    load1 = os.getloadavg()[0]
    if load1 > (os.cpu_count() or 1) / 2:
        print(f"note: load average {load1:.1f} while measuring: other processes shared the cores; "
              "compare columns of one run, not figures of separate runs")
    print(f"{over} of {len(rows) - 1} over {args.limit:g} s (best of {args.rounds}) in the last column")


if __name__ == "__main__":
    main()
