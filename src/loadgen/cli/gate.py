"""`loadgen compare` and `loadgen gate`: read two results directories, let analysis/compare.py and gate.py decide.

Errors a user can cause (a missing directory, a bad run.json, runs that cannot be compared, a bad
limit or gate file) become one line on stderr and exit code 2. The gate exits 1 on a regression.
"""

from __future__ import annotations

import json
import os
import sys
import tomllib
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from ..analysis.compare import RunComparison, compare_runs
from ..analysis.gate import (FAIL, INCONCLUSIVE, NOT_SIGNIFICANT, GateConfigError, build_config, parse_confidence,
                             parse_settings, run_gate)
from ..core.records import RequestRecord
from ..output.comparison import (check_line, comparison_markdown, comparison_table, gate_markdown, summary_line,
                                 untested_notes)
from ..results.reader import load_records, load_run
from .common import results_dir, user_errors


def load(results_dir_text: str, which: str) -> tuple[dict[str, Any], list[RequestRecord]]:
    path = results_dir(results_dir_text, which)
    return load_run(path), load_records(path)


def load_gate_file(path: Path) -> dict[str, Any]:
    """Read and check the [gate] table of a TOML file; errors read `file: key: what is wrong`."""
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


@click.command("compare")
@click.argument("baseline_dir")
@click.argument("candidate_dir")
@click.option("--format", "output_format", type=click.Choice(["table", "markdown", "json"]), default="table",
              show_default=True, help="Terminal table, Markdown, or JSON for other tools.")
@click.option("--confidence", default="0.95", show_default=True,
              help="Confidence at which each change is called significant (0.95 or 95%).")
def compare_command(baseline_dir: str, candidate_dir: str, output_format: str, confidence: str) -> None:
    """Compare two sweeps per target and level: values, change, and whether it is more than noise."""
    with user_errors():
        level = parse_confidence(confidence, "--confidence")
        baseline, candidate = load(baseline_dir, "baseline"), load(candidate_dir, "candidate")
        comparison = compare_runs(*baseline, *candidate, confidence=level)
    if output_format == "json":
        click.echo(json.dumps(comparison.to_dict(), indent=2, allow_nan=False))
    elif output_format == "markdown":
        click.echo(comparison_markdown(comparison), nl=False)
    else:
        Console().print(comparison_table(comparison))
        err = Console(stderr=True)
        for line in untested_notes(comparison):
            err.print(line, style="dim", highlight=False, markup=False, soft_wrap=True)
        print_notes(comparison, err)


FLAG_NAMES = {"max_throughput_drop": "--max-throughput-drop", "max_latency_rise": "--max-latency-rise",
              "max_error_rate": "--max-error-rate", "confidence": "--confidence", "metrics": "--metric",
              "strict": "--strict"}


@click.command("gate")
@click.argument("baseline_dir")
@click.argument("candidate_dir")
@click.option("--max-throughput-drop", help="Largest tolerated drop: 5% (throughput and decode tok/s), "
                                            "or throughput:5%,decode:10%.  [default: 5%]")
@click.option("--max-latency-rise", help="Largest tolerated rise: p99:10%,p50:5%,queue_wait:10% "
                                         "(a bare 10% sets all three).  [default: p50 5%, p99 10%, queue_wait 10%]")
@click.option("--max-error-rate", help="Ceiling on the candidate's failed/(ok+failed) per level.  [default: 0]")
@click.option("--confidence", help="Confidence of the whole gate; each check is tested at a Bonferroni-corrected "
                                   "level.  [default: 0.95]")
@click.option("--metric", "metrics", multiple=True,
              help="Metric to check (repeatable or comma-separated): throughput, latency_p50, latency_p99, "
                   "queue_wait_p50, decode_tok_s, error_rate.  [default: throughput, latency_p50, latency_p99, "
                   "error_rate]")
@click.option("--strict/--no-strict", default=None, help="Fail when a check is inconclusive (too little data).")
@click.option("--config", "config_file", help="A TOML file whose [gate] table sets these options; flags override it.")
def gate_command(baseline_dir: str, candidate_dir: str, max_throughput_drop: str | None, max_latency_rise: str | None,
                 max_error_rate: str | None, confidence: str | None, metrics: tuple[str, ...], strict: bool | None,
                 config_file: str | None) -> None:
    """Exit 1 when the candidate sweep regressed beyond a limit and the change is significant, else 0."""
    flags = {"max_throughput_drop": max_throughput_drop, "max_latency_rise": max_latency_rise,
             "max_error_rate": max_error_rate, "confidence": confidence, "metrics": list(metrics) or None,
             "strict": strict}
    with user_errors():
        from_file = load_gate_file(Path(config_file)) if config_file else {}
        config = build_config(from_file, parse_settings(flags, lambda key: FLAG_NAMES[key]))
        baseline, candidate = load(baseline_dir, "baseline"), load(candidate_dir, "candidate")
        result = run_gate(*baseline, *candidate, config)
    out, err = Console(), Console(stderr=True)
    print_notes(result.comparison, err)
    for check in result.checks:
        line = check_line(check, result.check_confidence)
        if check.status == FAIL or (check.status == INCONCLUSIVE and config.strict):
            out.print(line, style="red", highlight=False, markup=False, soft_wrap=True)
        elif check.status in (NOT_SIGNIFICANT, INCONCLUSIVE):
            err.print(f"note: {line}" if check.status == NOT_SIGNIFICANT else f"warning: {line}",
                      style="yellow", highlight=False, markup=False, soft_wrap=True)
    out.print(summary_line(result), style="bold red" if result.exit_code else "bold green",
              highlight=False, markup=False, soft_wrap=True)
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
