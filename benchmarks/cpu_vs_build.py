#!/usr/bin/env python3
"""The whole `loadgen sweep` command's steady CPU per request, against an earlier build, side by side.

The earlier build (a git revision, default 3a11f16 of 2026-12-01) is installed once into its own
virtual environment (cached under ~/.cache/loadgen/bench-builds/REV; `--system-site-packages`, so
both builds run on the same aiohttp, uvloop, numpy and msgspec, and only loadgen's own code
differs), and this tree's loadgen runs from the interpreter that runs this script.

The target is benchmarks/workers.py's private nginx: `POST /completion` answered at once with a
canned llama-server response, or 64 canned SSE events (`stream`), its worker pinned to one core and
each sweep to another, so the client's CPU is what is measured. Per build and part, two sweeps of
one level at concurrency 64 (`--short` and `--long` seconds; every feature that is off by default
off): their CPU (the kernel's accounting of the waited-for child) and requests are differenced, so
start-up, probing, warm-up and the final write cancel out and what is left is the steady cost of
one more request. Rounds alternate the builds' order (A B, B A, ...) and the ratio is each round's
own (this build / the earlier one), so a machine that is busier in one minute than the next moves
both sides of a ratio. Figures are printed, never asserted.

    python benchmarks/cpu_vs_build.py [--rev 3a11f16] [--rounds 3] [--short 3] [--long 12] [--parts nonstream,stream]

`--features` measures this tree alone instead: its default sweep against the same sweep with each
opt-in feature on (FEATURES: `--slo`, `--prometheus-port`, two request classes) and with the
machine's record off (`--no-environment`: the fingerprint, the per-second samples and energy,
which are on by default), interleaved in the same way; the difference is that feature's CPU per
request.

    python benchmarks/cpu_vs_build.py --features [--rounds 3] [--parts nonstream,stream]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_overhead import ensure_nginx, pick_cpus  # noqa: E402
from workers import BenchNginx  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path.home() / ".cache" / "loadgen" / "bench-builds"


# Each opt-in feature's flags, added to the default sweep ({port}: a free one).
FEATURES = {
    "--no-environment": ["--no-environment"],
    "--slo": ["--slo", "e2e=10s,queue=5s"],
    "--prometheus-port": ["--prometheus-port", "{port}"],
    # classes send their own counts ({requests}: 5,000 a second of the level's length), each class
    # alone and then both together
    "2 classes": ["--class", "name=a,n_predict=16,concurrency=32,requests={requests}",
                  "--class", "name=b,n_predict=16,concurrency=32,requests={requests}"],
}


class PinnedNginx(BenchNginx):
    """workers.py's nginx (JSON or SSE), its worker pinned to `cpu`."""

    def __init__(self, binary: str, stream: bool, cpu: int | None):
        super().__init__(binary, stream)
        self.cpu = cpu


def build_python(rev: str) -> str:
    """The interpreter of a virtual environment holding loadgen at `rev` (built once, then reused)."""
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", rev], capture_output=True, text=True,
                         check=True).stdout.strip()
    venv = CACHE / sha
    python = venv / "bin" / "python"
    if (venv / "ready").exists():
        return str(python)
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--clear", str(venv)], check=True)
    # The revision's package copied into the venv's own site-packages, which come before the system's
    # on sys.path (no build step: the package is pure Python; its dependencies are the system's).
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", sha, "src/loadgen"], capture_output=True,
                             check=True).stdout
    with tempfile.TemporaryDirectory(prefix="loadgen-build-") as tree:
        subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
        shutil.copytree(Path(tree) / "src" / "loadgen", Path(site) / "loadgen", dirs_exist_ok=True)
    found = subprocess.run([str(python), "-c", "import loadgen, sys; print(loadgen.__file__)"], capture_output=True,
                           text=True, check=True).stdout
    assert str(venv) in found, f"the build's venv imports another loadgen: {found}"
    (venv / "ready").write_text(sha + "\n")
    return str(python)


def children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def sweep(python: str, url: str, seconds: float, stream: bool, out: Path, cpu: int | None,
          extra: list[str] = ()) -> tuple[float, int]:
    """One sweep of one level at c=64 (or `extra`'s classes): (CPU seconds, requests of every level)."""
    from engine_overhead import free_port

    extra = [str(free_port()) if a == "{port}" else a.replace("{requests}", str(int(seconds * 5000))) for a in extra]
    load = [] if "--class" in extra else ["--concurrency", "64", "--duration", f"{seconds:g}"]
    cmd = [python, "-m", "loadgen", "sweep", "--url", url, *load,
           "--warmup", "2", "--no-histograms", "--output", str(out), *(["--stream"] if stream else []),
           *map(str, extra)]
    pin = (lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None
    before = children_cpu_s()
    done = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=pin, cwd=tempfile.gettempdir())
    used = children_cpu_s() - before
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr[-2000:]}")
    levels = json.loads((out / "run.json").read_text())["targets"][0]["levels"]
    return used, sum(lv["requests_ok"] + lv["requests_failed"] for lv in levels)


def steady_us(python: str, url: str, args: argparse.Namespace, stream: bool, work: Path, cpu: int | None,
              extra: list[str] = ()) -> float:
    """CPU µs per request of one more second of load: the long sweep minus the short one."""
    short_cpu, short_n = sweep(python, url, args.short, stream, work / "short", cpu, extra)
    long_cpu, long_n = sweep(python, url, args.long, stream, work / "long", cpu, extra)
    return (long_cpu - short_cpu) / (long_n - short_n) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rev", default="3a11f16", help="The earlier build (a git revision).")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--short", type=float, default=3.0)
    parser.add_argument("--long", type=float, default=12.0)
    parser.add_argument("--parts", default="nonstream,stream")
    parser.add_argument("--features", action="store_true", help="This tree's opt-in features instead of a build.")
    args = parser.parse_args()
    if args.features:
        return features(args)
    earlier = build_python(args.rev)
    builds = {args.rev: earlier, "this tree": sys.executable}
    client_cpu, server_cpu = pick_cpus()
    nginx = ensure_nginx()
    print(f"client on CPU {client_cpu}, nginx on CPU {server_cpu}; {args.rounds} rounds of "
          f"{args.short:g} s and {args.long:g} s levels at c=64; load average {os.getloadavg()[0]:.2f}", flush=True)
    for part in args.parts.split(","):
        stream = part == "stream"
        server = PinnedNginx(nginx, stream, server_cpu)
        server.start()
        figures: dict[str, list[float]] = {name: [] for name in builds}
        ratios = []
        try:
            with tempfile.TemporaryDirectory(prefix="loadgen-cpu-vs-build-") as tmp:
                for r in range(args.rounds):
                    order = list(builds) if r % 2 == 0 else list(reversed(builds))
                    got = {name: steady_us(builds[name], server.url, args, stream, Path(tmp) / f"{r}-{i}", client_cpu)
                           for i, name in enumerate(order)}
                    for name, us in got.items():
                        figures[name].append(us)
                    ratios.append(got["this tree"] / got[args.rev])
                    print(f"  {part} round {r + 1}: " + ", ".join(f"{n} {us:.1f} µs" for n, us in got.items())
                          + f"; ratio {ratios[-1]:.3f}", flush=True)
        finally:
            server.stop()
        print(f"{part}: {args.rev} {statistics.median(figures[args.rev]):.1f} µs/request, this tree "
              f"{statistics.median(figures['this tree']):.1f}; ratio (median of the rounds' own) "
              f"{statistics.median(ratios):.3f} ({', '.join(f'{x:.3f}' for x in ratios)})", flush=True)
    return 0


def features(args: argparse.Namespace) -> int:
    """This tree's default sweep against the same with each of FEATURES, round by round."""
    client_cpu, server_cpu = pick_cpus()
    nginx = ensure_nginx()
    variants = {"default": [], **FEATURES}
    print(f"client on CPU {client_cpu}, nginx on CPU {server_cpu}; {args.rounds} rounds; load average "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    for part in args.parts.split(","):
        server = PinnedNginx(nginx, part == "stream", server_cpu)
        server.start()
        deltas: dict[str, list[float]] = {name: [] for name in FEATURES}
        base: list[float] = []
        try:
            with tempfile.TemporaryDirectory(prefix="loadgen-cpu-features-") as tmp:
                for r in range(args.rounds):
                    order = list(variants) if r % 2 == 0 else list(reversed(variants))
                    got = {name: steady_us(sys.executable, server.url, args, part == "stream", Path(tmp) / f"{r}-{i}",
                                           client_cpu, variants[name]) for i, name in enumerate(order)}
                    base.append(got["default"])
                    for name in FEATURES:
                        deltas[name].append(got[name] - got["default"])
                    print(f"  {part} round {r + 1}: " + ", ".join(f"{n} {us:.1f}" for n, us in got.items()) + " µs",
                          flush=True)
        finally:
            server.stop()
        print(f"{part}: default {statistics.median(base):.1f} µs/request; " + ", ".join(
            f"{name} {statistics.median(d):+.1f}" for name, d in deltas.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
