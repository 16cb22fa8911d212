"""Does a short sweep give the same verdict every time? (issue 41)

Against `loadgen sim --profile smoke` servers of 2, 3 and 6 slots, the same short sweep (levels
well under a second, so the probe scrapes each only a few times) is run `--repeats` times per
server, and the distinct verdicts are counted. Before the verdict read its queuing from the
requests' own timings, one scrape more or less flipped it between "saturates between c=2 and c=4"
and "is not saturated ... waited to start, not for a slot". Also counted: runs that said "not
saturated" while a level had most requests waiting for a slot (a contradiction).

    python benchmarks/verdict_stability.py               # 20 repeats each (~6 min on 2 cores)
    python benchmarks/verdict_stability.py --repeats 5 --concurrency 2,4,8
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the tests' one helper module for the servers they start

from servers import LOADGEN, SimProcess  # noqa: E402


def verdict(url: str, out: Path, concurrency: str, requests: int) -> tuple[str, bool]:
    """The run's headline (its verdict's lines but the batching gain's) and whether it contradicts itself."""
    proc = subprocess.run([*LOADGEN, "sweep", "--url", url, "--concurrency", concurrency, "--requests", str(requests),
                           "--n-predict", "16", "--warmup", "1", "--no-histograms", "--output", str(out), "--force"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"loadgen sweep failed ({proc.returncode}): {proc.stderr[-2000:]}")
    v = json.loads((out / "run.json").read_text())["targets"][0]["verdict"]
    # The headline, and which kinds of line follow it (their figures vary from run to run)
    kinds = [kind for kind in ("too short", "not for a slot", "slot was free", "HTTP threads", "waited for a slot",
                               "cannot place a knee", "runs out of slots") if any(kind in line for line in v["verdict"])]
    head = " / ".join([v["verdict"][0], *kinds])
    slot_full = any(lv.get("slot_queued", 0) * 2 >= max(lv["requests"], 1) and lv["requests"] for lv in v["levels"])
    return head, "not saturated" in head and slot_full


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--slots", default="2,3,6")
    parser.add_argument("--concurrency", default="2,4")
    parser.add_argument("--requests", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for slots in [int(s) for s in args.slots.split(",")]:
            with SimProcess("--profile", "smoke", "--slots", str(slots)) as sim:
                seen: Counter[str] = Counter()
                contradictions = 0
                for i in range(args.repeats):
                    head, contradicts = verdict(sim.url, Path(tmp) / f"s{slots}-{i}", args.concurrency, args.requests)
                    seen[head] += 1
                    contradictions += contradicts
            print(f"{slots} slots, --concurrency {args.concurrency} --requests {args.requests}: "
                  f"{len(seen)} distinct verdict(s) in {args.repeats} runs, {contradictions} contradiction(s)")
            for head, n in seen.most_common():
                print(f"  {n:3d}×  {head}")


if __name__ == "__main__":
    main()
