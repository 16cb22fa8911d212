"""What the history store costs (issue 49): appending a run, and reading a large store back.

Builds a store of `--rows` level rows (runs of `--levels` levels each, of one target, spread over a
few builds, models and machines), then times, best of `--rounds`:
- `append`: one more run of `--levels` levels (what a finished sweep adds to its final write);
- `identities`: every run's identity (what `history check` reads before it picks a baseline);
- `trend_rows`: one figure of every row (what `history trend` reads).
Printed in milliseconds, with the store's size; compare `append` with a sweep's wall time.

    python benchmarks/history_store.py                 # 100,000 rows
    python benchmarks/history_store.py --rows 10000 --rounds 3
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
from pathlib import Path

from loadgen.results.history import LEVEL_COLUMNS, append, connect, identities, trend_rows


def run_doc(i: int, levels: int) -> dict:
    return {"kind": "sweep", "started_utc": f"2026-{1 + i % 12:02d}-01T00:00:{i % 60:02d}Z", "complete": True,
            "loadgen_version": "0.1", "config": {"n_predict": 64, "api": "llamacpp", "stream": False},
            "environment": {"os": "Linux", "cpu": {"model": f"cpu{i % 3}"}},
            "targets": [{"label": "a", "server": {"props": {"build_info": f"b{i // 50}", "model_path": f"/m/m{i % 2}.gguf",
                                                            "model_size": 100}},
                         "levels": [{"level": 2 ** k, "throughput_tok_s": 100.0 + k, "request_rate": 1.0,
                                     "latency_ms": {"p50": 10.0, "p99": 20.0}, "requests_ok": 16, "requests_failed": 0}
                                    for k in range(levels)]}]}


def fill(path: Path, rows: int, levels: int) -> None:
    """Bulk-insert `rows` level rows as rows // levels runs (one transaction)."""
    conn = connect(path)
    conn.execute("BEGIN")
    for i in range(rows // levels):
        cur = conn.execute("INSERT INTO runs (folder, started_utc, kind, workload_hash, machine_hash, complete)"
                           " VALUES (?,?,?,?,?,1)", (f"/r/{i}", f"2026-01-01T{i % 24:02d}:00:00Z", "sweep", "w",
                                                     f"h{i % 3}"))
        run_id = cur.lastrowid
        values = {c: None for c in LEVEL_COLUMNS}
        conn.executemany(f"INSERT INTO levels ({', '.join(LEVEL_COLUMNS)}) VALUES ({', '.join('?' * len(LEVEL_COLUMNS))})",
                         [tuple({**values, "run_id": run_id, "label": "a", "level": 2 ** k, "kind": "sweep",
                                 "build_info": f"b{i // 50}", "model": f"m{i % 2}.gguf", "model_size": 100,
                                 "throughput_tok_s": 100.0 + k}[c] for c in LEVEL_COLUMNS) for k in range(levels)])
    conn.execute("COMMIT")
    conn.close()


def best_ms(fn, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--levels", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "history.sqlite"
        fill(path, args.rows, args.levels)
        counter = iter(range(10**9))
        append_ms = best_ms(lambda: append(path, run_doc(next(counter), args.levels), "/r/new"), args.rounds)
        ident_ms = best_ms(lambda: identities(path), args.rounds)
        trend_ms = best_ms(lambda: trend_rows(path, "throughput_tok_s", "a"), args.rounds)
        with sqlite3.connect(path) as conn:
            n = conn.execute("SELECT COUNT(*) FROM levels").fetchone()[0]
        size = path.stat().st_size / 2**20
    print(f"history store of {n:,} level rows ({size:.1f} MiB), best of {args.rounds}:")
    print(f"  append one run of {args.levels} levels: {append_ms:.1f} ms")
    print(f"  identities (history check's read):     {ident_ms:.1f} ms")
    print(f"  trend_rows (history trend's read):     {trend_ms:.1f} ms")


if __name__ == "__main__":
    main()
