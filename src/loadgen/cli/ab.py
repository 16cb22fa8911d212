"""`loadgen ab`: interleaved A/B runs of two targets (or A/A of one), then the gate.

The CI recipe for a machine whose speed drifts: baseline and candidate run in pairs,
counterbalanced (A B, B A, A B, ...), so slow drift hits both sides alike, each pair's difference
cancels what the two runs shared, and a steady trend does not always favour the first of a pair; the gate then judges the sides against the run-to-run noise the pairs show,
pooled with a calibrated noise floor when one is given. Each run is a fresh `loadgen sweep`
process with the same arguments, so nothing of one run's client (its heap, its connections)
carries into the next.

Both sides are checked before the first run: each URL parses and accepts a TCP connection, and the
sweep options are valid (as `loadgen run --check` checks them). A run that stops shows the sweep's
reason. Ctrl-C (or SIGTERM to loadgen) reaches the sweep under way, which saves what it has; the
runs so far stay on disk and no further one starts. `--resume DIR` continues: the sides, repeat,
label and sweep options come from DIR/ab.json, runs whose run.json is complete are kept, the rest
run again.
"""

from __future__ import annotations

import shlex
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import msgspec
from rich.console import Console

from ..core.baseurl import BaseUrl, BaseUrlError
from ..core.errors import EXIT_FAILED, InputError, ResultsError
from ..core.processes import start_tied
from ..core.signals import LATCH
from ..results.atomic import write_json
from ..results.reader import load_run
from .common import user_errors
from .gate import env_guard, gate_config, gate_options, report_gate
from .help import command
from .shared import CHECK_ONLY

RESERVED = ("--url", "--ports", "--host", "--label", "--output", "--force")
AB_FILE = "ab.json"  # what --resume needs: the sides, repeat, label and sweep options
CONNECT_TIMEOUT_S = 5.0


def stop_reason(stderr: str) -> str:
    """The line of a stopped sweep's stderr that says why: its last line that is not where the
    results went ("results: ...", "report: ...")."""
    lines = [line.strip() for line in stderr.splitlines()
             if line.strip() and not line.startswith(("results:", "report:"))]
    return lines[-1] if lines else "(no message)"


def check_side(which: str, url: str, label: str, sweep_args: tuple[str, ...]) -> None:
    """One side before any run: its URL parses, a TCP connection to it opens, and the sweep options
    with it are valid. InputError naming the side otherwise."""
    try:
        base = BaseUrl.parse(url)
    except BaseUrlError as exc:
        raise InputError(f"--{which}-url {url!r}: {exc}") from None
    from .main import cli

    sweep = cli.get_command(None, "sweep")
    try:
        with sweep.make_context("sweep", [*sweep_args, "--url", url, "--label", label]) as ctx:
            ctx.meta[CHECK_ONLY] = True
            sweep.invoke(ctx)
    except click.ClickException as exc:
        raise InputError(f"sweep options: {exc.format_message()}") from None
    host, _, port = base.netloc.rpartition("@")[2].rpartition(":")
    if not host or not port.isdigit():
        host, port = base.netloc.rpartition("@")[2], "443" if base.scheme == "https" else "80"
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except ConnectionRefusedError:
        raise InputError(f"the {which} {url}: connection refused by {host}:{port} (is the server running?)") from None
    except OSError as exc:
        raise InputError(f"the {which} {url}: cannot connect ({exc.strerror or exc})") from None


def done(out: Path) -> bool:
    """A run of an earlier ab that finished: its run.json says complete."""
    try:
        return load_run(out).complete
    except ResultsError:
        return False


def resumed(root: Path, baseline_url: str | None, candidate_url: str | None, output: str | None,
            sweep_args: tuple[str, ...]) -> tuple[str, str, int, str, tuple[str, ...]]:
    """The sides, repeat, label and sweep options of the ab in `root`; InputError when the command
    line gives any of them again (they would be ignored)."""
    given = [name for name, value in (("--baseline-url", baseline_url), ("--candidate-url", candidate_url),
                                      ("--output", output), ("sweep options", sweep_args)) if value]
    if given:
        raise InputError(f"--resume continues an ab as it was given; leave out {', '.join(given)}")
    saved = load_ab(root)
    return saved.baseline_url, saved.candidate_url, saved.repeat, saved.label, tuple(saved.sweep_args)


def new_ab(root: Path, force: bool, saved: dict[str, Any]) -> Path:
    """The folder of a new ab, with its ab.json; an earlier ab's runs there only with --force."""
    from ..results.writer import prepare_dir

    root = prepare_dir(root, force)
    earlier = [root / side for side in ("baseline", "candidate") if (root / side).exists()]
    if earlier and not force:
        raise InputError(f"{root} already holds A/B runs; continue them with --resume {root}, choose "
                         "another --output or add --force")
    for folder in earlier:  # --force: the runs of an earlier ab, and nothing else, are replaced
        shutil.rmtree(folder)
    write_json(root / AB_FILE, saved, indent=1)
    return root


class AbPlan(msgspec.Struct, frozen=True):
    """ab.json as `--resume` reads it (keys it does not read are ignored)."""

    baseline_url: str
    candidate_url: str
    repeat: int
    label: str
    sweep_args: list[str]
    # one side's own sweep options, after the shared ones (--baseline-args, --candidate-args)
    baseline_args: list[str] = []
    candidate_args: list[str] = []


def load_ab(root: Path) -> AbPlan:
    try:
        return msgspec.json.decode((root / AB_FILE).read_bytes(), type=AbPlan)
    except FileNotFoundError:
        raise InputError(f"{root}: no {AB_FILE}; give a folder written by `loadgen ab`") from None
    except (OSError, msgspec.DecodeError) as exc:
        raise InputError(f"{root / AB_FILE} is damaged ({exc}); start the A/B again") from None


def order(repeat: int) -> list[tuple[int, str]]:
    """(run number, side) in the order they run: pairs, counterbalanced (A B, B A, A B, ...), so a
    machine that keeps slowing down (or warming up) over the session does not always hand the
    second run of a pair the worse of it: a steady drift cancels over the pairs."""
    sides = ("baseline", "candidate")
    return [(i, side) for i in range(1, repeat + 1) for side in (sides if i % 2 else sides[::-1])]


def run_summary(out: Path) -> str:
    """"12.3 tok/s at c=1, 20.1 at c=2" from a finished run's run.json."""
    from ..analysis.grid_cells import run_line

    try:
        return run_line(load_run(out))  # a sweep's levels: "12.3 tok/s at 1, 20.1 at 2"
    except ResultsError:
        return "no levels"


def side_args(text: str, option: str) -> tuple[str, ...]:
    """One side's own sweep options, split as a shell splits them; InputError for options ab sets itself."""
    try:
        args = tuple(shlex.split(text))
    except ValueError as exc:
        raise InputError(f"{option}: {exc}") from None
    clash = next((a for a in args if a.split("=")[0] in RESERVED), None)
    if clash:
        raise InputError(f"{option}: {clash.split('=')[0]} is set by ab itself")
    return args


def one_sweep(url: str, label: str, sweep_args: tuple[str, ...], out: Path) -> subprocess.CompletedProcess:
    """A `loadgen sweep` in its own process; a signal loadgen receives meanwhile is passed on to it."""
    cmd = [sys.executable, "-m", "loadgen.cli", "sweep", "--url", url, "--label", label, *sweep_args,
           "--output", str(out)]
    # Its own session: a Ctrl-C at the terminal reaches loadgen only, which passes it on once (the
    # sweep then stops gracefully, as after one Ctrl-C, instead of seeing two).
    proc = start_tied(cmd, signal.SIGINT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                      start_new_session=True)
    LATCH.listen(lambda signum: proc.poll() is None and proc.send_signal(signum))
    try:
        stdout, stderr = proc.communicate()
    finally:
        LATCH.listen(None)
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


@command("ab", context_settings={"ignore_unknown_options": True})
@click.option("--baseline-url", help="The baseline server's base URL.")
@click.option("--candidate-url", help="The candidate server's (the same one for an A/A run).")
@click.option("--repeat", type=click.IntRange(min=1, max=100), default=3, show_default=True, help="Runs per side.")
@click.option("--label", default="server", show_default=True,
              help="The label both sides' results carry (compare matches targets by label).")
@click.option("--output", type=click.Path(file_okay=False), help="Folder for the runs [default: results/<UTC time>-ab]: "
                                                                 "OUTPUT/baseline/NN and OUTPUT/candidate/NN.")
@click.option("--force", is_flag=True, help="Overwrite a folder that already holds runs.")
@click.option("--no-gate", is_flag=True, help="Only record the runs (e.g. an A/A for `loadgen calibrate`).")
@click.option("--resume", type=click.Path(file_okay=False),
              help="Continue an interrupted ab in this folder (its sides and sweep options as first given).")
@click.option("--baseline-args", default="", metavar="'OPTIONS'",
              help="Sweep options for the baseline's runs only, after the shared ones (e.g. '--lora-mix 0:1').")
@click.option("--candidate-args", default="", metavar="'OPTIONS'",
              help="Sweep options for the candidate's runs only: with one URL for both, an A/B of two "
                   "settings of the load (e.g. '--lora-mix 0:1,1:1', docs/lora.md).")
@gate_options
@click.argument("sweep_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- SWEEP OPTIONS]")
def ab_command(baseline_url, candidate_url, repeat, label, output, force, no_gate, resume, baseline_args,
               candidate_args, max_throughput_drop, max_latency_rise, max_error_rate, confidence, metrics, strict,
               config_file, noise_file, allow_env_change, sweep_args) -> None:
    """Run BASELINE and CANDIDATE sweeps in pairs (A B, B A, A B ...), --repeat times each, then gate them.

    Everything after `--` goes to every `loadgen sweep` (e.g. -- --concurrency 1,4 --n-predict 32).
    """
    from ..analysis.gate import run_gate
    from ..results.sides import load_side, side_noise
    from ..results.writer import default_dir

    with user_errors():
        if resume:
            root = Path(resume)
            if baseline_args or candidate_args:
                raise InputError("--resume continues an ab as it was given; leave out --baseline-args and "
                                 "--candidate-args")
            baseline_url, candidate_url, repeat, label, sweep_args = resumed(root, baseline_url, candidate_url,
                                                                             output, sweep_args)
            plan = load_ab(root)
            baseline_args, candidate_args = shlex.join(plan.baseline_args), shlex.join(plan.candidate_args)
        elif not (baseline_url and candidate_url):
            raise InputError("give --baseline-url and --candidate-url (or --resume DIR)")
        clash = next((a for a in sweep_args if a.split("=")[0] in RESERVED), None)
        if clash:
            raise InputError(f"{clash.split('=')[0]} is set by ab itself; give --baseline-url, --candidate-url, "
                             "--label and --output to ab")
        config = None if no_gate else gate_config(max_throughput_drop, max_latency_rise, max_error_rate,
                                                  confidence, metrics, strict, config_file)
        base_own, cand_own = side_args(baseline_args, "--baseline-args"), side_args(candidate_args, "--candidate-args")
        check_side("baseline", baseline_url, label, (*sweep_args, *base_own))
        check_side("candidate", candidate_url, label, (*sweep_args, *cand_own))
        if not resume:
            root = new_ab(Path(output) if output else default_dir(Path("results"), "ab"), force,
                          {"baseline_url": baseline_url, "candidate_url": candidate_url, "repeat": repeat,
                           "label": label, "sweep_args": list(sweep_args), "baseline_args": list(base_own),
                           "candidate_args": list(cand_own)})
    LATCH.install()
    run_pairs(root, {"baseline": baseline_url, "candidate": candidate_url}, label, repeat,
              {"baseline": (*sweep_args, *base_own), "candidate": (*sweep_args, *cand_own)}, bool(resume))
    if config is None:
        return
    with user_errors():
        base_dir = root / "baseline"
        baseline, candidate = load_side(base_dir), load_side(root / "candidate")
        baseline, candidate = env_guard(baseline, candidate, allow_env_change)
        result = run_gate(baseline, candidate, config,
                          floors=side_noise(base_dir, Path(noise_file) if noise_file else None))
    report_gate(result, config.strict)


def run_pairs(root: Path, urls: dict[str, str], label: str, repeat: int, args: dict[str, tuple[str, ...]],
              resume: bool) -> None:
    """The runs, side by side in counterbalanced pairs, each side's sweep with its own `args`; a
    run that stops ends ab with its exit code (the runs so far kept for --resume)."""
    err = Console(stderr=True)
    for i, side in order(repeat):
        out = root / side / f"{i:02d}"
        err.print(f"ab: {side} run {i}/{repeat} ...", highlight=False, end="")
        if resume and done(out):
            err.print(f" kept from before: {run_summary(out)}", highlight=False)
            continue
        shutil.rmtree(out, ignore_errors=True)  # an interrupted run, run again
        proc = one_sweep(urls[side], label, args[side], out)
        if proc.returncode != 0:
            err.print(f" stopped (exit {proc.returncode})", highlight=False)
            err.print(stop_reason(proc.stderr), highlight=False, markup=False, soft_wrap=True)
            err.print(f"ab: the runs so far are in {root}; continue with loadgen ab --resume {root}", highlight=False)
            sys.exit(LATCH.exit_code or proc.returncode or EXIT_FAILED)
        err.print(f" {run_summary(out)}", highlight=False)
    err.print(f"ab: {repeat}+{repeat} interleaved runs in {root}", highlight=False)
