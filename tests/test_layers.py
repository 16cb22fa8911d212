"""The layering stays visible: every module imports only the layers below its own (docs/architecture.md).

    core  <-  client, analysis  <-  run  <-  results  <-  output  <-  cli  <-  kinds   (sim: core and run.loops)

Every import is read with `ast` (relative ones, and those inside functions, too), so an upward edge
or a `from .x import _private` across modules fails here. The results reader is held to more: it
reads only core and the schema, and a fresh process that reads a run (`analyze`, `export`,
`gate`) loads neither the engine nor an HTTP client.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "loadgen"
GOLDEN = Path(__file__).parent / "data" / "sweep-sim-v2"

# What each layer may import besides itself and core. The root package (`loadgen`, its
# __version__) is a face every layer may read.
ALLOWED = {
    "core": set(),
    "client": set(),
    "analysis": set(),
    "run": {"client", "analysis"},
    "results": {"analysis", "run"},
    "output": {"client", "analysis", "run", "results"},
    "cli": {"client", "analysis", "run", "results", "output", "sim"},
    # a run kind's folder (core/kinds.py names each by import string: nothing below imports one)
    "kinds": {"client", "analysis", "run", "results", "output", "cli"},
    "sim": set(),
    "__main__": {"cli"},  # the entry point of `python -m loadgen`
}
# Narrower rules for single modules: module -> the only loadgen modules (prefixes) it may import.
ONLY = {
    "loadgen.results.schema": ("loadgen.core",),
    "loadgen.results.reader": ("loadgen.core", "loadgen.results.schema"),
    "loadgen.sim": ("loadgen.core", "loadgen.sim", "loadgen.run.loops"),
}
# Functions longer than 60 lines from before the layering; nothing new may join them.
LONG_FUNCTIONS = {("loadgen.run.session", "execute"), ("loadgen.sim.params", "to_json")}


@dataclass(frozen=True)
class Edge:
    target: str  # the imported loadgen module (or package)
    names: tuple[str, ...]  # the names taken from it (`from X import a, b`); () for `import X`
    line: int


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_module(dotted: str) -> bool:
    path = SRC / Path(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def import_edges(source: str, module: str, is_package: bool = False) -> list[Edge]:
    """Every import of a loadgen module in `source` (the module `module`), wherever it is written."""
    package = module if is_package else module.rpartition(".")[0]
    edges = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            edges += [Edge(a.name, (), node.lineno) for a in node.names if a.name.split(".")[0] == "loadgen"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "loadgen":
                continue
            for alias in node.names:  # `from pkg import module` is an edge to that module
                sub = f"{target}.{alias.name}"
                edges.append(Edge(sub, (), node.lineno) if is_module(sub) else Edge(target, (alias.name,), node.lineno))
    return edges


def layer_of(dotted: str) -> str | None:
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else None


def violations(module: str, edges: list[Edge]) -> list[str]:
    """What breaks the layer rules or takes a private name from another module."""
    out = []
    layer = layer_of(module)
    only = next((allowed for prefix, allowed in ONLY.items() if module == prefix or module.startswith(prefix + ".")),
                None)
    for edge in edges:
        where = f"{module}:{edge.line}: imports {edge.target}"
        target_layer = layer_of(edge.target)
        if only is not None:
            if target_layer is not None and not any(edge.target == p or edge.target.startswith(p + ".") for p in only):
                out.append(f"{where}, but it may import only {', '.join(only)}")
        elif target_layer is not None and layer is not None and target_layer not in {layer, "core"} | ALLOWED[layer]:
            out.append(f"{where}: {layer} may not import {target_layer}")
        elif layer is None and module == "loadgen" and target_layer is not None:
            out.append(f"{where}: the package face imports nothing")
        private = [n for n in edge.names if n.startswith("_") and not n.startswith("__")]
        if private and edge.target != module:
            out.append(f"{module}:{edge.line}: takes private {', '.join(private)} from {edge.target}")
    return out


def source_modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py"))


def test_every_module_imports_only_the_layers_below_and_no_private_names():
    found = []
    for path in source_modules():
        module = module_name(path)
        found += violations(module, import_edges(path.read_text(encoding="utf-8"), module, path.name == "__init__.py"))
    assert found == []


@pytest.mark.parametrize("module, source, expected", [
    ("loadgen.core.clock", "from ..run.engine import run_level", "core may not import run"),
    ("loadgen.analysis.metrics", "def f():\n    from ..client import transport\n", "analysis may not import client"),
    ("loadgen.client.probe", "import loadgen.output.tables", "client may not import output"),
    ("loadgen.run.sweep", "from ..results.writer import write_results", "run may not import results"),
    ("loadgen.results.reader", "from ..run.state import Run", "may import only loadgen.core"),
    ("loadgen.sim.server", "from ..run.engine import run_level", "may import only"),
    ("loadgen.run.steps", "from .sweep import _prepare", "takes private _prepare from loadgen.run.sweep"),
])
def test_the_checker_catches_an_upward_edge_and_a_private_import(module, source, expected):
    found = violations(module, import_edges(source, module))
    assert len(found) == 1 and expected in found[0], found


def test_the_checker_lets_a_layer_import_downward():
    assert violations("loadgen.run.sweep", import_edges(
        "from ..client.probe import Probe\nfrom ..analysis import metrics\nfrom .state import Run\n"
        "from ..core.records import LevelRun\nfrom .. import __version__", "loadgen.run.sweep")) == []
    assert violations("loadgen.sim.cli", import_edges("from ..run.loops import loop_factory", "loadgen.sim.cli")) == []


def test_no_module_but_the_package_face_and_entry_point_sits_at_the_top():
    assert sorted(p.name for p in PACKAGE.glob("*.py")) == ["__init__.py", "__main__.py"]
    layers = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
    assert layers == sorted(layer for layer in ALLOWED if layer != "__main__")


def test_no_new_function_is_over_60_lines():
    long = set()
    for path in source_modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                long.add((module_name(path), node.name))
    assert long <= LONG_FUNCTIONS, long - LONG_FUNCTIONS


HEAVY = ("aiohttp", "httptools", "loadgen.run.engine")


def loaded_after(code: str) -> list[str]:
    """The HEAVY modules a fresh interpreter has loaded after running `code`."""
    probe = f"{code}\nimport sys\nprint('loaded:', *(m for m in {HEAVY!r} if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()[-1].split()[1:]


def cli_code(*args: str) -> str:
    # exit 3: a gate of a run against itself has nothing to enforce (one run a side), and says so
    return (f"import sys\nsys.argv = ['loadgen', *{list(args)!r}]\nfrom loadgen.cli import main\n"
            "try:\n    main()\nexcept SystemExit as exc:\n    assert exc.code in (None, 0, 3), exc.code\n")


def test_importing_the_results_reader_loads_no_engine_and_no_http_client():
    assert loaded_after("import loadgen.results.reader") == []


@pytest.mark.parametrize("args", [
    ("analyze", str(GOLDEN)),
    ("export", str(GOLDEN), "--format", "json", "--output", "{out}"),
    ("gate", str(GOLDEN), str(GOLDEN)),
])
def test_reading_a_saved_run_loads_no_engine_and_no_http_client(args, tmp_path):
    args = tuple(a.format(out=tmp_path) for a in args)
    assert loaded_after(cli_code(*args)) == []


def test_the_probe_itself_sees_a_command_that_loads_the_engine():
    assert "loadgen.run.engine" in loaded_after("import loadgen.run.sweep")
