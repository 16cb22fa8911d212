"""`loadgen ab`: interleaved A/B runs of two targets (or A/A of one), then the gate.

The CI recipe for a machine whose speed drifts: baseline and candidate run in pairs,
counterbalanced (A B, B A, A B, ...), so slow drift hits both sides alike, each pair's difference
cancels what the two runs shared, and a steady trend does not always favour the first of a pair; the gate then judges the sides against the run-to-run noise the pairs show,
pooled with a calibrated noise floor when one is given. Each run is a fresh `loadgen sweep`
process with the same arguments, so nothing of one run's client (its heap, its connections)
carries into the next.

Ctrl-C (or SIGTERM to loadgen) reaches the sweep under way, which saves what it has; the runs so
far stay on disk and no further one starts.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import click
from rich.console import Console

from ..analysis.gate import run_gate
from ..core.errors import EXIT_FAILED, InputError
from ..core.signals import LATCH
from ..results.sides import load_side, side_noise
from ..results.writer import default_dir, prepare_dir
from .common import die_with_parent, user_errors
from .gate import env_guard, gate_config, gate_options, report_gate
from .help import command

RESERVED = ("--url", "--ports", "--host", "--label", "--output", "--force")


def order(repeat: int) -> list[tuple[int, str]]:
    """(run number, side) in the order they run: pairs, counterbalanced (A B, B A, A B, ...), so a
    machine that keeps slowing down (or warming up) over the session does not always hand the
    second run of a pair the worse of it: a steady drift cancels over the pairs."""
    sides = ("baseline", "candidate")
    return [(i, side) for i in range(1, repeat + 1) for side in (sides if i % 2 else sides[::-1])]


def run_summary(out: Path) -> str:
    """"12.3 tok/s at c=1, 20.1 at c=2" from a finished run's run.json."""
    try:
        doc = json.loads((out / "run.json").read_text())
        levels = doc["targets"][0]["levels"]
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return "no levels"
    return ", ".join(f"{lv['throughput_tok_s']:.1f} tok/s at {lv.get('level')}" for lv in levels) or "no levels"


def one_sweep(url: str, label: str, sweep_args: tuple[str, ...], out: Path) -> subprocess.CompletedProcess:
    """A `loadgen sweep` in its own process; a signal loadgen receives meanwhile is passed on to it."""
    cmd = [sys.executable, "-m", "loadgen.cli", "sweep", "--url", url, "--label", label, *sweep_args,
           "--output", str(out)]
    # Its own session: a Ctrl-C at the terminal reaches loadgen only, which passes it on once (the
    # sweep then stops gracefully, as after one Ctrl-C, instead of seeing two).
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=die_with_parent(signal.SIGINT))
    LATCH.listen(lambda signum: proc.poll() is None and proc.send_signal(signum))
    try:
        stdout, stderr = proc.communicate()
    finally:
        LATCH.listen(None)
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


@command("ab", context_settings={"ignore_unknown_options": True})
@click.option("--baseline-url", required=True, help="The baseline server's base URL.")
@click.option("--candidate-url", required=True, help="The candidate server's (the same one for an A/A run).")
@click.option("--repeat", type=click.IntRange(min=1, max=100), default=3, show_default=True, help="Runs per side.")
@click.option("--label", default="server", show_default=True,
              help="The label both sides' results carry (compare matches targets by label).")
@click.option("--output", type=click.Path(file_okay=False), help="Folder for the runs [default: results/<UTC time>-ab]: "
                                                                 "OUTPUT/baseline/NN and OUTPUT/candidate/NN.")
@click.option("--force", is_flag=True, help="Overwrite a folder that already holds runs.")
@click.option("--no-gate", is_flag=True, help="Only record the runs (e.g. an A/A for `loadgen calibrate`).")
@gate_options
@click.argument("sweep_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- SWEEP OPTIONS]")
def ab_command(baseline_url, candidate_url, repeat, label, output, force, no_gate, max_throughput_drop,
               max_latency_rise, max_error_rate, confidence, metrics, strict, config_file, noise_file,
               allow_env_change, sweep_args) -> None:
    """Run BASELINE and CANDIDATE sweeps in pairs (A B, B A, A B ...), --repeat times each, then gate them.

    Everything after `--` goes to every `loadgen sweep` (e.g. -- --concurrency 1,4 --n-predict 32).
    """
    with user_errors():
        clash = next((a for a in sweep_args if a.split("=")[0] in RESERVED), None)
        if clash:
            raise InputError(f"{clash.split('=')[0]} is set by ab itself; give --baseline-url, --candidate-url, "
                             "--label and --output to ab")
        config = None if no_gate else gate_config(max_throughput_drop, max_latency_rise, max_error_rate,
                                                  confidence, metrics, strict, config_file)
        root = prepare_dir(Path(output) if output else default_dir(Path("results"), "ab"), force)
        earlier = [root / side for side in ("baseline", "candidate") if (root / side).exists()]
        if earlier and not force:
            raise InputError(f"{root} already holds A/B runs; choose another --output or add --force")
        for folder in earlier:  # --force: the runs of an earlier ab, and nothing else, are replaced
            shutil.rmtree(folder)
    err = Console(stderr=True)
    LATCH.install()
    urls = {"baseline": baseline_url, "candidate": candidate_url}
    for i, side in order(repeat):
        out = root / side / f"{i:02d}"
        err.print(f"ab: {side} run {i}/{repeat} ...", highlight=False, end="")
        proc = one_sweep(urls[side], label, tuple(sweep_args), out)
        if proc.returncode != 0:
            err.print(f" stopped (exit {proc.returncode})", highlight=False)
            tail = [line for line in proc.stderr.strip().splitlines() if line.strip()][-1:] or ["(no message)"]
            err.print(tail[0], highlight=False, markup=False, soft_wrap=True)
            err.print(f"ab: the runs so far are in {root}", highlight=False)
            sys.exit(LATCH.exit_code or proc.returncode or EXIT_FAILED)
        err.print(f" {run_summary(out)}", highlight=False)
    err.print(f"ab: {repeat}+{repeat} interleaved runs in {root}", highlight=False)
    if config is None:
        return
    with user_errors():
        base_dir = root / "baseline"
        baseline, candidate = load_side(base_dir), load_side(root / "candidate")
        baseline, candidate = env_guard(baseline, candidate, allow_env_change)
        result = run_gate(baseline, candidate, config,
                          floors=side_noise(base_dir, Path(noise_file) if noise_file else None))
    report_gate(result, config.strict)
