"""Does loadgen's probe disturb the server it measures? (issue 32)

Against the real test bed (llama-server, SmolLM2-135M Q4_1, `-t 1 --metrics`), with 1 slot and
with 2 slots, the same sweep (c = 1, 2, 4, `--n-predict 32 --requests 8`) is run `--repeats` times
with the probe on (the default, `--probe-interval 0.25`) and off (`--probe-interval 0`),
interleaved (on, off, on, off, ...) so the machine's drift falls on both alike. Printed per server
and level: throughput mean ± sd with the probe on and off and their ratio, and the levels where a
request waited more than 1 s while a slot was free (held outside the server: the HTTP layer).
Before the probe closed its connections, 3 of ~20 such sweeps had a c=4 level where a request
waited 8.4 s for 0.8 s of server work.

    python benchmarks/probe_cost.py                  # 5 repeats a side (~10 min on 2 cores)
    python benchmarks/probe_cost.py --repeats 20 --slots 1,2
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the tests' one helper module for the servers they start

from servers import LOADGEN, start_llama_server  # noqa: E402


def sweep(url: str, out: Path, probe: bool) -> dict:
    proc = subprocess.run([*LOADGEN, "sweep", "--url", url, "--concurrency", "1,2,4", "--n-predict", "32",
                           "--requests", "8", "--warmup", "1", "--no-histograms", "--output", str(out),
                           "--probe-interval", "0.25" if probe else "0"], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"loadgen sweep failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads((out / "run.json").read_text())["targets"][0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--slots", default="1,2")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for slots in [int(s) for s in args.slots.split(",")]:
            server = start_llama_server(None, slots, Path(tmp))
            tput: dict[tuple[int, bool], list[float]] = defaultdict(list)
            held: list[str] = []
            try:
                for i in range(args.repeats):
                    for probe in (True, False):
                        target = sweep(server.url, Path(tmp) / f"s{slots}-{i}-{probe}", probe)
                        for lv, q in zip(target["levels"], target["verdict"]["levels"]):
                            tput[(lv["level"], probe)].append(lv["throughput_tok_s"])
                            if (q.get("held_outside_max_ms") or 0) > 1000 or (q.get("unheld_longest_s") or 0) > 1:
                                held.append(f"run {i} probe {'on' if probe else 'off'} c={lv['level']}: held "
                                            f"{q.get('held_outside')} up to {q.get('held_outside_max_ms')} ms, "
                                            f"unheld by scrapes {q.get('unheld_longest_s')} s")
            finally:
                server.stop()
            print(f"llama-server --parallel {slots}, {args.repeats} sweeps a side (probe on / off), tok/s:")
            for c in (1, 2, 4):
                on, off = tput[(c, True)], tput[(c, False)]
                print(f"  c={c}: on {statistics.fmean(on):6.2f} ± {statistics.pstdev(on):5.2f}   "
                      f"off {statistics.fmean(off):6.2f} ± {statistics.pstdev(off):5.2f}   "
                      f"on/off {statistics.fmean(on) / statistics.fmean(off):.3f}")
            print(f"  levels with a request held outside the server > 1 s: {len(held)}")
            for line in held:
                print(f"    {line}")


if __name__ == "__main__":
    main()
