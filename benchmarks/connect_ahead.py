"""What a level's latency includes when its connections are opened before its clock starts.

Against a private nginx (Debian's package, with its echo module) that answers every request 50 ms
after it arrives, `loadgen sweep` at one concurrency (default 256) runs a short level and a long one
(default 5 s and 30 s, `--warmup 0`), and the figures of each are printed: p50/p99 latency, the
first round's median (the first C requests by send time) against the rest's, how many requests
opened a connection, and how many connections nginx saw carry the level's requests.

Before loadgen opened a level's connections ahead, the first round paid for C connects at once:
83-87 ms where every later request took under 60, so a 5 s level's p99 read 83.6 ms against a
10 s level's 53.4 (wrk: 54.7). With them opened ahead, the short level's p99 should be within
~2 ms of the long one's.

    python benchmarks/connect_ahead.py                    # c=256, 5 s and 30 s (~1 min)
    python benchmarks/connect_ahead.py --concurrency 64 --short 2 --long 10
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the tests' one helper module for the servers they start

from loadgen.analysis.metrics import latency_ms  # noqa: E402
from loadgen.core.records import RequestRecord  # noqa: E402
from servers import LOADGEN, Nginx, start_nginx  # noqa: E402

COMPLETION = ('{"content":"x","tokens_predicted":1,"stop":true,"stop_type":"limit","id_slot":0,'
              '"timings":{"prompt_n":1,"prompt_ms":0.1,"predicted_n":1,"predicted_ms":0.1,'
              '"predicted_per_second":10000.0,"cache_n":0}}')
ECHO_50MS = f"location / {{ default_type application/json; echo_sleep 0.05; echo '{COMPLETION}'; }}"


def level(nginx: Nginx, out: Path, concurrency: int, seconds: float) -> dict:
    before = len(nginx.requests_log())
    proc = subprocess.run([*LOADGEN, "sweep", "--url", nginx.url, "--concurrency", str(concurrency),
                           "--duration", str(seconds), "--warmup", "0", "--output", str(out)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"loadgen sweep failed ({proc.returncode}): {proc.stderr[-2000:]}")
    doc = json.loads((out / "run.json").read_text())
    lv = doc["targets"][0]["levels"][0]
    recs = sorted((RequestRecord.from_dict(json.loads(x)) for x in (out / "requests.jsonl").read_text().splitlines()),
                  key=lambda r: r.send_ns)
    first = sorted(latency_ms(r) for r in recs[:concurrency] if r.ok)
    rest = sorted(latency_ms(r) for r in recs[concurrency:] if r.ok)
    log = [row for row in nginx.requests_log()[before:] if row[2] == "/completion"]
    return {
        "seconds": seconds, "requests": len(recs), "p50": lv["latency_ms"]["p50"], "p99": lv["latency_ms"]["p99"],
        "first_round_p50": first[len(first) // 2] if first else float("nan"),
        "rest_p50": rest[len(rest) // 2] if rest else float("nan"),
        "opened": lv.get("connections_opened"), "server_connections": len({c for c, _, _ in log}),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--short", type=float, default=5.0, help="the short level, s")
    ap.add_argument("--long", type=float, default=30.0, help="the long level, s")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="loadgen-bench-") as tmp:
        with start_nginx(ECHO_50MS, modules=("ngx_http_echo_module",), http="keepalive_requests 100000000; keepalive_timeout 600s;") as nginx:
            rows = [level(nginx, Path(tmp) / f"run-{s:g}", args.concurrency, s) for s in (args.short, args.long)]
    print(f"c={args.concurrency} against nginx answering every request 50 ms after it arrives\n")
    print(f"{'level':>7} {'requests':>9} {'p50 ms':>7} {'p99 ms':>7} {'1st round p50':>14} {'rest p50':>9} "
          f"{'opened':>7} {'server conns':>13}")
    for r in rows:
        print(f"{r['seconds']:>6g}s {r['requests']:>9,} {r['p50']:>7.1f} {r['p99']:>7.1f} {r['first_round_p50']:>14.1f} "
              f"{r['rest_p50']:>9.1f} {r['opened'] if r['opened'] is not None else 'n/a':>7} {r['server_connections']:>13}")
    print(f"\np99 short - long: {rows[0]['p99'] - rows[1]['p99']:+.1f} ms")


if __name__ == "__main__":
    main()
