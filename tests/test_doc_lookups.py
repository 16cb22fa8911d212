"""Readers read run documents by attribute (issue 33): the string-key look-ups left in output/,
analysis/ and cli/ are counted, and the count may only fall.

A look-up is a subscript by a string constant (`doc["targets"]`) or a `.get("...")` call: an AST
walk cannot tell a run document from another dict, so this counts every one (a server's JSON, a
config mapping, a dict being built too) in every file but those of `EXCLUDED`, modules that read no
run document at all (each with its reason). Counts: 527 on the day this test was written (output
291, analysis 123, cli 113), before run.json had a typed reader (results/document.py); 104 before
`load_run` itself returned the typed document (core/rundoc.py) and the files below were set apart.
What the count holds now (12): two reads of a run document, `compare`'s every config key
(analysis/run_identity.py: the typed document keeps only the keys its readers read) and the verdict
sentence of capacity.json's content as `capacity` prints it; the rest are dicts that are no run
document in files that also read one (the gate's settings, click's values in cli/grid.py, the
[gate] table and GITHUB_STEP_SUMMARY in cli/gate.py).
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

SRC = Path(__file__).parents[1] / "src" / "loadgen"
READERS = ("output", "analysis", "cli")
# Modules that read no run document (run.json, grid.json, capacity.json): their look-ups are of other
# JSON, text or mappings, so none is counted. A module that reads a run document is never here.
EXCLUDED = {
    "analysis/aggregate.py": "computes level summaries from request records: its own metric series by name",
    "analysis/bootlog.py": "parses llama-server's boot log into facts (its own values by name)",
    "analysis/kv.py": "reads a GGUF header's metadata keys (general.architecture, ...)",
    "analysis/paramcheck_verdict.py": "reads a server's answers to canary requests (/completion, /slots, /props)",
    "cli/help.py": "click's context meta and an option's attributes",
    "cli/observe.py": "click's target flags as one mapping",
    "cli/request_features.py": "reads a user's JSON schema and tool definitions (OpenAI's tool shape)",
    "cli/scenario.py": "a scenario file's TOML value",
    "cli/shared.py": "the COLUMNS environment variable",
    "output/kv.py": "builds `loadgen kv`'s JSON from a GGUF's KV estimate",
}
CEILING = 12  # (104 before, every file counted) analysis/gate.py's settings (6), cli/grid.py's click values (2), cli/gate.py's [gate] table and GITHUB_STEP_SUMMARY (2), run_identity's config keys, capacity's sentence


def string_lookups(source: str) -> int:
    """How many string-key subscripts and .get("...") calls the module's code holds."""
    count = 0
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
                and isinstance(node.slice.value, str) or isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            count += 1
    return count


def test_string_lookups_counts_subscripts_and_gets_by_string_only():
    assert string_lookups('d["a"]; d.get("b"); d.get("c", 1); d[0]; d[k]; d.get(k); x.a["b"]["c"]') == 5


def test_readers_hold_no_more_string_key_lookups_than_the_ceiling():
    by_file = Counter({str(p.relative_to(SRC)): string_lookups(p.read_text())
                       for package in READERS for p in (SRC / package).rglob("*.py")
                       if str(p.relative_to(SRC)) not in EXCLUDED})
    total = sum(by_file.values())
    assert total <= CEILING, f"{total} string-key look-ups (ceiling {CEILING}); most in {by_file.most_common(5)}"


DOCUMENT_READERS = {"RunDocument", "Target", "Level", "Verdict", "LevelVerdict", "GridDocument", "RunData",
                    "load_run", "load_run_dict", "load_grid"}


def test_an_excluded_module_imports_no_run_document_nor_its_reader():
    for name in EXCLUDED:
        tree = ast.parse((SRC / name).read_text())  # a module that is gone fails here: take it out
        imports = [node for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
        held = {alias.name for node in imports for alias in node.names} & DOCUMENT_READERS
        assert not held, f"{name} imports {sorted(held)}: it reads run documents, count its look-ups"
        assert not any((node.module or "").startswith("results") for node in imports), name
