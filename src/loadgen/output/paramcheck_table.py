"""`loadgen paramcheck`'s table: one row per parameter with its verdict and the evidence, then what the
gateway changed in the answers. Reads the verdicts (analysis/paramcheck_verdict.py), nothing else."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from ..analysis.paramcheck_verdict import ParamVerdict

STYLE = {"honoured": "green", "dropped": "bold red", "altered": "bold red", "cannot tell": "yellow"}
FILE = "paramcheck.json"


def print_paramcheck(via: str, api: str, results: Sequence[ParamVerdict], metadata: Sequence[str], out: Console) -> None:
    """The verdicts through the gateway at `via`, then what it changed in the answers (`metadata`)."""
    table = Table(title=f"parameters through {via} (api {api})", title_justify="left")
    for name in ("parameter", "sent", "verdict", "evidence"):
        table.add_column(name, overflow="fold")
    for row in results:
        table.add_row(row.param, json.dumps(row.sent), f"[{STYLE[row.verdict]}]{row.verdict}[/]", row.evidence)
    out.print(table)
    for note in metadata:
        out.print(f"gateway: {note}", highlight=False, markup=False)
    failing = [r.param for r in results if r.verdict in ("dropped", "altered")]
    if failing:
        out.print(f"not passed as sent: {', '.join(failing)}", style="bold red", highlight=False)


def paramcheck_file(doc: dict[str, Any]) -> tuple[str, bytes]:
    """The result document as the file the results folder holds."""
    return FILE, (json.dumps(doc, indent=2, allow_nan=False) + "\n").encode()
