#!/usr/bin/env python3
"""What `--prometheus-port` costs per request and per scrape, measured alone (no server).

- queue: the observer call the engine makes per finished request (`LiveObserver.request_done`:
  the record is appended to a deque, the wrapped observer called), in CPU µs per request;
- drain: counting the queued records in a batch (off the event loop), CPU µs per record, for a
  plain record and for a streamed one with 64 chunk gaps;
- scrape: one GET of the endpoint from the same process (client and server side), CPU ms.

Figures, not asserts. `python benchmarks/live_metrics.py [--records 200000]`
"""

from __future__ import annotations

import argparse
import socket
import time
import urllib.request

from loadgen.core.records import LevelRun, ServerOutcome, make_record
from loadgen.run.live.endpoint import LiveEndpoint
from loadgen.run.live.metrics import LiveMetrics

MS = 1_000_000


class _Inner:
    def request_done(self, record: object) -> None:
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=200_000)
    n = ap.parse_args().records
    ok = ServerOutcome(predicted_n=96, prompt_ms=5.1, predicted_ms=500.0)
    plain = make_record("bench", 64, 0, 0, "s", 0, 520 * MS, 200, ok, 10 * MS, 0)
    streamed = make_record("bench", 64, 0, 0, "s", 0, 520 * MS, 200, ok, 10 * MS, 0, 30 * MS, 500 * MS,
                           list(range(1000, 65000, 1000)), 65)
    live = LiveMetrics((64,))
    live.level_started(LevelRun("bench", 64), None, None)
    observer = live.observe(_Inner())
    batch = 10_000  # a second's worth at 10k requests/s: the endpoint drains at least every second
    for name, record in (("plain", plain), ("streamed, 64 gaps", streamed)):
        queue_s = drain_s = 0.0
        for _ in range(max(1, n // batch)):
            c0 = time.process_time()
            for _ in range(batch):
                observer.request_done(record)
            c1 = time.process_time()
            live.drain()
            c2 = time.process_time()
            queue_s, drain_s = queue_s + c1 - c0, drain_s + c2 - c1
        done = max(1, n // batch) * batch
        print(f"{name:<18} queue {queue_s / done * 1e6:5.2f} µs/request   drain {drain_s / done * 1e6:5.2f} µs/record "
              f"(batches of {batch:,})")
    with LiveEndpoint(live, _free_port()) as endpoint:
        urllib.request.urlopen(endpoint.url).read()
        c0 = time.process_time()
        for _ in range(50):
            urllib.request.urlopen(endpoint.url).read()
        print(f"scrape             {(time.process_time() - c0) / 50 * 1e3:5.2f} CPU ms (client and endpoint)")


if __name__ == "__main__":
    main()
