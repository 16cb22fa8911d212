"""`loadgen paramcheck`'s table: one row per parameter with its verdict and the evidence, then what the
gateway changed in the answers. Reads the result document (a dict), nothing else."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.table import Table

STYLE = {"honoured": "green", "dropped": "bold red", "altered": "bold red", "cannot tell": "yellow"}
FILE = "paramcheck.json"


def print_paramcheck(doc: dict[str, Any], out: Console) -> None:
    table = Table(title=f"parameters through {doc['via']} (api {doc['api']})", title_justify="left")
    for name in ("parameter", "sent", "verdict", "evidence"):
        table.add_column(name, overflow="fold")
    for row in doc["params"]:
        table.add_row(row["param"], json.dumps(row["sent"]), f"[{STYLE[row['verdict']]}]{row['verdict']}[/]",
                      row["evidence"])
    out.print(table)
    for note in doc["metadata"]:
        out.print(f"gateway: {note}", highlight=False, markup=False)
    failing = [r["param"] for r in doc["params"] if r["verdict"] in ("dropped", "altered")]
    if failing:
        out.print(f"not passed as sent: {', '.join(failing)}", style="bold red", highlight=False)


def paramcheck_file(doc: dict[str, Any]) -> tuple[str, bytes]:
    """The result document as the file the results folder holds."""
    return FILE, (json.dumps(doc, indent=2, allow_nan=False) + "\n").encode()
