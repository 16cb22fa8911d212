"""`loadgen compare`, `loadgen gate` and `loadgen calibrate`: read two sides (a results directory each,
or a folder of several runs each), let analysis/compare.py and gate.py decide.

Errors a user can cause (a missing directory, a bad run.json, runs that cannot be compared, a bad
limit or gate file) become one line on stderr and exit code 2. The gate exits 1 on a regression,
and EXIT_NOT_ENFORCED (3) when its runs could enforce none of its limits. Both refuse with
EXIT_ENV_CHANGED (4) when the machine under the sides differs (analysis/env_drift.py) unless
--allow-env-change.
"""

from __future__ import annotations

import json
import os
import sys
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console

from ..analysis.env_drift import changed_levels, environment_differences, spoiling
from ..analysis.run_identity import first_difference
from ..core.errors import EXIT_ENV_CHANGED, EXIT_FAILED, EXIT_NOT_ENFORCED, InputError, UserError
from ..core.rundoc import json_safe
from ..output.layout import print_table
from .common import results_dir, user_errors
from .help import output_option
from .shared import console as _console

if TYPE_CHECKING:
    from ..analysis.compare import NoiseFloors, RunComparison, RunData
    from ..analysis.gate import GateConfig, GateResult


def load(results_dir_text: str, which: str) -> list[RunData]:
    """A side: one results directory, or a folder of them."""
    from ..results.sides import load_side

    return load_side(results_dir(results_dir_text, which))


def without_spoiled_levels(runs: list[RunData], which: str, allow: bool, err: Console) -> list[RunData]:
    """The runs without their levels whose machine changed during them (analysis/env_drift.spoiling;
    steal alone spoils none), each said on stderr; all of them with `allow`."""
    from ..results.sides import without_levels

    if allow:
        return runs
    out = []
    for run in runs:
        spoiled = {(t.label, lv.level) for t in run.typed.targets for lv in t.levels
                   if spoiling(lv.environment_changed or [])}
        for label, level in sorted(spoiled, key=str):
            err.print(f"left out: {label} at level {level} of the {which}: the machine changed during it "
                      f"(--allow-env-change keeps it)", style="yellow", highlight=False, markup=False, soft_wrap=True)
        if not spoiled:
            out.append(run)
            continue
        out.append(without_levels(run, spoiled))
    return out


def env_guard(baseline: list[RunData], candidate: list[RunData], allow: bool,
              notes: bool = True) -> tuple[list[RunData], list[RunData]]:
    """The drift guard (analysis/env_drift.py): say which levels' machine changed during them (a warning)
    and what differs between the machines under the two sides (a refusal, EXIT_ENV_CHANGED, unless
    `allow`); returns the sides without the levels a change spoiled (all of them with `allow`). `notes`
    False leaves out what could not be compared and the servers' builds and flags (bisect: they differ
    by design)."""
    err = Console(stderr=True)
    differences, said = environment_differences([r.typed for r in baseline], [r.typed for r in candidate])
    during = [f"{side} {line}" for side, runs in (("baseline", baseline), ("candidate", candidate))
              for line in changed_levels(r.typed for r in runs)]
    for line in said if notes else ():
        err.print(f"note: {line}", style="dim", highlight=False, markup=False, soft_wrap=True)
    for line in during:  # a warning, not a refusal: a change under load also shows as a difference below
        err.print(f"warning: the machine changed during {line}", style="yellow", highlight=False, markup=False,
                  soft_wrap=True)
    lines = [f"environment: {d}" for d in differences]
    for line in lines:
        err.print(f"{'warning: ' if allow else ''}{line}", style="yellow", highlight=False, markup=False,
                  soft_wrap=True)
    if lines and not allow:
        raise UserError("the machine under the two sides differs (above), so their figures may differ for "
                        "that reason; measure on the same machine state, or add --allow-env-change to compare "
                        "anyway", exit_code=EXIT_ENV_CHANGED)
    return (without_spoiled_levels(baseline, "baseline", allow, err),
            without_spoiled_levels(candidate, "candidate", allow, err))


ALLOW_ENV_HELP = ("Compare even when the machine under the two sides differs (warn instead of refusing with "
                  "exit 4).")


def noise_for(baseline_dir: str, noise_file: str | None) -> NoiseFloors | None:
    from ..results.sides import side_noise

    return side_noise(Path(baseline_dir), Path(noise_file) if noise_file else None)


def load_gate_file(path: Path) -> dict[str, Any]:
    """Read and check the [gate] table of a TOML file; errors read `file: key: what is wrong`."""
    from ..analysis.gate import GateConfigError, parse_settings

    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise GateConfigError(f"{path}: not found") from None
    except OSError as exc:
        raise GateConfigError(f"{path}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise GateConfigError(f"{path}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise GateConfigError(f"{path}: not valid TOML ({exc})") from None
    unknown = [key for key in data if key != "gate"]
    if unknown:
        raise GateConfigError(f"{path}: {unknown[0]}: unknown table or key; only a [gate] table is read")
    table = data.get("gate")
    if not isinstance(table, dict):
        raise GateConfigError(f"{path}: gate: missing; put the settings under a [gate] table")
    return parse_settings(table, lambda key: f"{path}: {key}")


def print_notes(comparison: RunComparison, err: Console) -> None:
    for line in comparison.warnings:
        err.print(f"warning: {line}", style="yellow", highlight=False, markup=False, soft_wrap=True)
    for line in comparison.skipped:
        err.print(f"skipped: {line}", style="dim", highlight=False, markup=False, soft_wrap=True)


NOISE_HELP = ("A noise.json from `loadgen calibrate` to judge differences against [default: the baseline "
              "folder's noise.json, if any].")


@click.command("compare")
@click.argument("baseline_dir")
@click.argument("candidate_dir")
@click.option("--noise", "noise_file", type=click.Path(dir_okay=False), help=NOISE_HELP)
@click.option("--format", "output_format", type=click.Choice(["table", "markdown", "json"]), default="table",
              show_default=True, help="Terminal table, Markdown, or JSON for other tools.")
@click.option("--confidence", default="0.95", show_default=True,
              help="Confidence at which each change is called significant (0.95 or 95%).")
@click.option("--allow-env-change", is_flag=True, help=ALLOW_ENV_HELP)
def compare_command(baseline_dir: str, candidate_dir: str, noise_file: str | None, output_format: str,
                    confidence: str, allow_env_change: bool = False) -> None:
    """Compare two sides (a sweep each, or a folder of runs each) per target and level: values,
    change, and whether it is more than the run-to-run noise."""
    from ..analysis.compare import compare_sides
    from ..analysis.gate import parse_confidence
    from ..output.comparison import comparison_markdown, comparison_table, untested_notes

    with user_errors():
        level = parse_confidence(confidence, "--confidence")
        baseline, candidate = load(baseline_dir, "baseline"), load(candidate_dir, "candidate")
        baseline, candidate = env_guard(baseline, candidate, allow_env_change)
        comparison = compare_sides(baseline, candidate, confidence=level, floors=noise_for(baseline_dir, noise_file))
    if output_format == "json":
        click.echo(json.dumps(json_safe(comparison.to_dict()), indent=2, allow_nan=False))  # --rate inf: "inf"
    elif output_format == "markdown":
        click.echo(comparison_markdown(comparison), nl=False)
    else:
        print_table(_console(), comparison_table(comparison))
        err = Console(stderr=True)
        for line in untested_notes(comparison):
            err.print(line, style="dim", highlight=False, markup=False, soft_wrap=True)
        print_notes(comparison, err)


FLAG_NAMES = {"max_throughput_drop": "--max-throughput-drop", "max_latency_rise": "--max-latency-rise",
              "max_error_rate": "--max-error-rate", "confidence": "--confidence", "metrics": "--metric",
              "strict": "--strict"}


def gate_options(command):
    """The gate's limit options, shared by `gate` and `ab`."""
    options = [
        click.option("--max-throughput-drop", help="Largest tolerated drop: 5% (throughput, decode tok/s, goodput, attainment), "
                                                   "or throughput:5%,decode:10%.  [default: 5%]"),
        click.option("--max-latency-rise", help="Largest tolerated rise: p99:10%,p50:5%,queue_wait:10%,ttft_p99:10% "
                                                "(a bare 10% sets every latency).  [default: a p50 5%, a p99 10%, "
                                                "queue_wait 10%]"),
        click.option("--max-error-rate", help="Ceiling on the candidate's failed/(ok+failed) per level.  [default: 0]"),
        click.option("--confidence", help="Confidence of the whole gate; each check is tested at a "
                                          "Bonferroni-corrected level.  [default: 0.95]"),
        click.option("--metric", "metrics", multiple=True,
                     help="Metric to check (repeatable or comma-separated): throughput, latency_p50, latency_p99, "
                          "queue_wait_p50, queue_wait_p99, decode_tok_s, error_rate; streaming runs also ttft_p50, "
                          "ttft_p99, tpot_p50, tpot_p99; runs made with --slo also goodput and attainment.  "
                          "[default: throughput, latency_p50, latency_p99, error_rate]"),
        click.option("--strict/--no-strict", default=None, help="Fail when a check is inconclusive (the runs cannot "
                                                                "tell)."),
        click.option("--config", "config_file", type=click.Path(dir_okay=False), help="A TOML file whose [gate] table sets these options; flags "
                                                     "override it."),
        click.option("--noise", "noise_file", type=click.Path(dir_okay=False), help=NOISE_HELP),
        click.option("--allow-env-change", is_flag=True, help=ALLOW_ENV_HELP),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def gate_config(max_throughput_drop: str | None, max_latency_rise: str | None, max_error_rate: str | None,
                confidence: str | None, metrics: tuple[str, ...], strict: bool | None,
                config_file: str | None) -> GateConfig:
    from ..analysis.gate import build_config, parse_settings

    flags = {"max_throughput_drop": max_throughput_drop, "max_latency_rise": max_latency_rise,
             "max_error_rate": max_error_rate, "confidence": confidence, "metrics": list(metrics) or None,
             "strict": strict}
    from_file = load_gate_file(Path(config_file)) if config_file else {}
    return build_config(from_file, parse_settings(flags, lambda key: FLAG_NAMES[key]))


@click.command("gate")
@click.argument("baseline_dir")
@click.argument("candidate_dir")
@gate_options
def gate_command(baseline_dir: str, candidate_dir: str, max_throughput_drop: str | None, max_latency_rise: str | None,
                 max_error_rate: str | None, confidence: str | None, metrics: tuple[str, ...], strict: bool | None,
                 config_file: str | None, noise_file: str | None, allow_env_change: bool = False) -> None:
    """Exit 1 when the candidate regressed beyond a limit by more than the run-to-run noise; 3 when
    the runs could enforce none of the limits on throughput and latency; else 0.

    Each side is a results directory or a folder of several (runs are the unit: with one run a side
    and no noise floor a change cannot be told from the machine's drift, and no limit is enforced)."""
    from ..analysis.gate import run_gate

    with user_errors():
        config = gate_config(max_throughput_drop, max_latency_rise, max_error_rate, confidence, metrics, strict,
                             config_file)
        baseline, candidate = load(baseline_dir, "baseline"), load(candidate_dir, "candidate")
        baseline, candidate = env_guard(baseline, candidate, allow_env_change)
        result = run_gate(baseline, candidate, config, floors=noise_for(baseline_dir, noise_file))
    report_gate(result, config.strict)


def report_gate(result: GateResult, strict: bool) -> None:
    """The gate's lines, summary and step summary; exits 1 on a failed gate, 3 on one not enforced."""
    from ..analysis.gate import FAIL, INCONCLUSIVE
    from ..output.comparison import check_line, detection_lines, gate_markdown, summary_line

    out, err = Console(), Console(stderr=True)
    print_notes(result.comparison, err)
    for line in detection_lines(result):
        err.print(line, style="yellow" if line.startswith("warning") else "dim", highlight=False, markup=False,
                  soft_wrap=True)
    for check in result.checks:
        line = check_line(check, result.check_confidence)
        if check.status == FAIL or (check.status == INCONCLUSIVE and strict):
            out.print(line, style="red", highlight=False, markup=False, soft_wrap=True)
        elif check.status == INCONCLUSIVE:
            err.print(f"warning: {line}",
                      style="yellow", highlight=False, markup=False, soft_wrap=True)
    style = {EXIT_FAILED: "bold red", EXIT_NOT_ENFORCED: "bold yellow"}.get(result.exit_code, "bold green")
    out.print(summary_line(result), style=style, highlight=False, markup=False, soft_wrap=True)
    write_step_summary(gate_markdown(result), err)
    if result.exit_code:
        sys.exit(result.exit_code)


def write_step_summary(markdown: str, err: Console) -> None:
    """Append to $GITHUB_STEP_SUMMARY when GitHub Actions sets it; a failure to write is only a warning."""
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if not path:
        return
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(markdown + "\n")
    except OSError as exc:
        err.print(f"warning: cannot write the step summary to {path} ({exc.strerror})", style="yellow",
                  highlight=False, markup=False, soft_wrap=True)


@click.command("calibrate")
@click.argument("runs_dir")
@output_option("out_file", "Where to write the noise file [default: RUNS_DIR/noise.json].",
               type=click.Path(dir_okay=False))
def calibrate_command(runs_dir: str, out_file: str | None) -> None:
    """Measure this machine's run-to-run noise from several runs of one unchanged configuration
    (a folder of results directories, such as an A/A `loadgen ab`), for `compare` and `gate`."""
    from ..analysis.compare import compare_sides, noise_floors
    from ..results.grid_file import runs_in_grid
    from ..results.noise import write_noise
    from ..results.sides import calibration_runs, run_dirs

    with user_errors():
        path = results_dir(runs_dir, "runs")
        named = calibration_runs(path)
        runs = [run for _, run in named]
        if len(runs) < 3:
            raise InputError(f"{path}: {len(runs)} run(s); a noise floor needs at least 3 runs of one configuration")
        differs = first_difference([(name, run.doc) for name, run in named], restarted=runs_in_grid(path) is not None)
        if differs:
            raise InputError(f"{path}: not runs of one configuration: {differs}; calibrate measures the noise of "
                             "one unchanged configuration against one server (an A/A: `loadgen ab` with the same "
                             "URL on both sides)")
        baseline = runs[:1]
        for run in runs[1:]:
            compare_sides(baseline, [run])  # refuses runs that cannot be compared, in one line
        floors = noise_floors(runs)
        # a grid's cell named under the grid (GRID/c01) has its folder at GRID/cells/c01
        home = path if path.is_dir() else run_dirs(path)[0].parents[1]
        target = Path(out_file) if out_file else home / "noise.json"
        try:
            write_noise(target, floors, len(runs))
        except OSError as exc:
            raise InputError(f"cannot write {target} ({exc.strerror})") from None
    out = Console()
    for metric, floor in floors.by_metric.items():
        out.print(f"{metric}: run-to-run noise {floor.sigma:.1%} ({floor.df} differences of neighbouring runs)",
                  highlight=False)
    out.print(f"noise floor written to {target}; `loadgen gate BASELINE CANDIDATE --noise {target}` judges against it",
              highlight=False, soft_wrap=True)
