#!/usr/bin/env python3
"""What a drawn workload (docs/workloads.md) costs the client per request, beside a fixed shape.

A workload adds work in three places of a request's path; each is timed here in-process, on the
same synthetic records, with and without the workload (median of rounds, µs per request):

  body      `backend.build(salt, seq)`: one of 256 pre-serialised bodies (each with its own
            n_predict) instead of one
  record    the engine's `_Sender._append`: the shape's two lengths looked up per record
  aggregate `LevelAggregate.add_batch`: the level's token-count distributions (metric_defs'
            metrics with `tokens`: prompt_n, predicted_n, cache_n) kept beside the latency ones

Timings are printed, never asserted.

    python benchmarks/workload_cost.py [--requests 50000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

from loadgen.analysis import aggregate, metric_defs
from loadgen.client.backends import GenerationParams, make_backend
from loadgen.core.records import LevelRun, ServerOutcome
from loadgen.core.workload import Workload, parse_length_spec
from loadgen.run.engine import _Sender


class _Null:
    def request_done(self, record) -> None:
        pass


class _NoTransport:
    request = None


def _time(fn, rounds: int, n: int) -> float:
    samples = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t) / n * 1e6)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    n, rounds = args.requests, args.rounds
    shapes = Workload(parse_length_spec("uniform:64:1024"), parse_length_spec("normal:200,50,min=8")).draw()
    body = "word " * 200
    fixed = make_backend("llamacpp", GenerationParams(prompt=body))
    drawn = make_backend("llamacpp", GenerationParams(prompt=body, prompts=(body,) * len(shapes),
                                                      n_predicts=tuple(s.n_predict for s in shapes)))
    salt = "12345678-1234-1234-1234-123456789012"
    rows = []
    for name, backend in (("fixed", fixed), ("drawn", drawn)):
        rows.append(("body", name, _time(lambda b=backend: [b.build(salt, i) for i in range(n)], rounds, n)))

    outcome = ServerOutcome(prompt_n=300, prompt_ms=10.0, predicted_n=96, predicted_ms=100.0, tokens_predicted=96)

    def append(level_shapes) -> list:
        level = LevelRun(target="t", concurrency=1, prompt_tokens=None if level_shapes else 300, shapes=level_shapes)
        sender = _Sender(level, _NoTransport(), fixed, _Null())  # type: ignore[arg-type]
        for i in range(n):
            sender._append(0, i, salt, i * 1000, i * 1000 + 500, 200, None, None, None, outcome)
        return level.records

    for name, level_shapes in (("fixed", ()), ("drawn", shapes)):
        rows.append(("record", name, _time(lambda s=level_shapes: append(s), rounds, n)))
    records = append(shapes)
    by = {(s, k): v for s, k, v in rows}
    print(f"{n:,} requests, median of {rounds} rounds, µs per request")
    print(f"{'step':<10} {'fixed':>8} {'drawn':>8} {'ratio':>7}")
    for step in ("body", "record"):
        a, b = by[(step, "fixed")], by[(step, "drawn")]
        print(f"{step:<10} {a:8.3f} {b:8.3f} {b / a:7.2f}")
    # The token distributions are kept for every run, fixed or drawn: their share of add_batch.
    whole = _time(lambda: aggregate.LevelAggregate().add_batch(records), rounds, n)

    token_metrics = [m for m in metric_defs.all_metrics() if m.tokens]  # prompt_n, predicted_n, cache_n

    def tokens_alone() -> None:
        batch = metric_defs.Batch(records)
        for m in token_metrics:
            aggregate._TokenSeries().add(m.vectorised(batch))

    part = _time(tokens_alone, rounds, n)
    print(f"aggregate {whole:8.3f} µs per request, of which the token series "
          f"({', '.join(m.name for m in token_metrics)}) {part:.3f} "
          f"({part / whole:.0%})")


if __name__ == "__main__":
    main()
