"""The rooms inside the floors (docs/architecture.md): no import circle between the modules of one
package, and no module of cli/ runs an event loop (the session is run/session.py's; cli/ parses,
calls and prints).

Imports are read with `ast` as tests/test_layers.py reads them (inside functions too), so a lazy
import that hides a circle still counts.
"""

from __future__ import annotations

import ast
from collections import defaultdict

import pytest

from test_layers import PACKAGE, import_edges, module_name, source_modules

# Circles that are older than this test, each in a part of issue #33 another change takes on; none
# may join them, and one that is gone must leave the list.
KNOWN_CIRCLES = {
    # GenerationParams lives in the package face that also picks the backend; every backend of
    # the face is in it (responses and messages came with the same face, embeddings and the request
    # features' fields (features.py, which the face's bodies use) too, and the images' wrapper, which
    # the face picks: not a new circle).
    frozenset({"loadgen.client.backends", "loadgen.client.backends.llamacpp", "loadgen.client.backends.openai",
               "loadgen.client.backends.responses", "loadgen.client.backends.messages",
               "loadgen.client.backends.embeddings", "loadgen.client.backends.features",
               "loadgen.client.backends.images"}),
}
EVENT_LOOP_MODULES = ("asyncio", "uvloop", "loadgen.run.loops")


def package_graphs(modules: dict[str, str]) -> dict[str, dict[str, set[str]]]:
    """Per package, its modules' imports of each other (the package's own __init__ counts as one of
    them). `modules`: module name -> source; a name ending in `.__init__` is a package face."""
    graphs: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for name, source in modules.items():
        is_package = name.endswith(".__init__")
        module = name.removesuffix(".__init__")
        package = module if is_package else module.rpartition(".")[0]
        graphs[package][module]  # every module is a node, importing or not
        for edge in import_edges(source, module, is_package):
            if edge.target != module and (edge.target == package or edge.target.rpartition(".")[0] == package):
                graphs[package][module].add(edge.target)
    return graphs


def circles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected groups of more than one module: each module of a group reaches every
    other by imports."""
    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    reached = {m: reach(m) for m in graph}
    groups = {frozenset({m} | {n for n in reached[m] if m in reached.get(n, ())}) for m in graph}
    return {g for g in groups if len(g) > 1}


def loadgen_sources() -> dict[str, str]:
    out = {}
    for path in source_modules():
        name = module_name(path) + (".__init__" if path.name == "__init__.py" else "")
        out[name] = path.read_text(encoding="utf-8")
    return out


def test_no_import_circle_between_the_modules_of_one_package():
    found = set().union(*(circles(g) for g in package_graphs(loadgen_sources()).values()))
    assert found - KNOWN_CIRCLES == set(), "new import circle(s)"
    assert KNOWN_CIRCLES - found == set(), "gone: take them out of KNOWN_CIRCLES"


@pytest.mark.parametrize("sources, expected", [
    ({"p.a": "from .b import x", "p.b": "from .a import y"}, {frozenset({"p.a", "p.b"})}),
    ({"p.a": "from .b import x", "p.b": "from .c import y", "p.c": "def f():\n    from .a import z\n"},
     {frozenset({"p.a", "p.b", "p.c"})}),
    ({"p.__init__": "def f():\n    from .a import A\n", "p.a": "from . import Params"}, {frozenset({"p", "p.a"})}),
    ({"p.a": "from .b import x", "p.b": "from ..q.a import y", "q.a": "from ..p.a import z"}, set()),  # across packages
    ({"p.a": "from .b import x", "p.b": "import os"}, set()),
    ({"p.a": "from . import b", "p.b": "from .a import x"}, {frozenset({"p.a", "p.b"})}),
])
def test_the_circle_finder_sees_circles_within_a_package_only(sources, expected, monkeypatch):
    # Written short: every module is under loadgen. (only loadgen's imports are edges).
    sources = {f"loadgen.{name}": source for name, source in sources.items()}
    expected = {frozenset(f"loadgen.{m}" for m in group) for group in expected}
    # `from . import b`: an edge to the module p.b only when there is one.
    monkeypatch.setattr("test_layers.is_module", lambda dotted: dotted in sources or f"{dotted}.__init__" in sources)
    found = set().union(*(circles(g) for g in package_graphs(sources).values()))
    assert found == expected


def event_loop_imports(source: str, module: str) -> list[str]:
    """The event-loop modules (asyncio, uvloop, run/loops.py) that `source` imports, wherever."""
    hits = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            hits += [a.name for a in node.names if a.name.split(".")[0] in ("asyncio", "uvloop")]
        elif (isinstance(node, ast.ImportFrom) and not node.level and node.module
              and node.module.split(".")[0] in ("asyncio", "uvloop")):
            hits.append(node.module)
    hits += [e.target for e in import_edges(source, module) if e.target.startswith(EVENT_LOOP_MODULES[2])]
    return hits


def test_no_module_of_cli_runs_an_event_loop():
    found = {}
    for path in sorted((PACKAGE / "cli").rglob("*.py")):
        module = module_name(path)
        hits = event_loop_imports(path.read_text(encoding="utf-8"), module)
        if hits:
            found[module] = hits
    assert found == {}


@pytest.mark.parametrize("source, expected", [
    ("import asyncio", ["asyncio"]),
    ("def f():\n    import uvloop\n", ["uvloop"]),
    ("from asyncio import run", ["asyncio"]),
    ("from ..run.loops import loop_factory", ["loadgen.run.loops"]),
    ("from ..run.session import execute", []),
    ("from ..run.sweep import run_sweep\nimport click", []),
])
def test_the_event_loop_check_sees_each_way_in(source, expected):
    assert event_loop_imports(source, "loadgen.cli.x") == expected
