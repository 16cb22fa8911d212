"""The README is a door and docs/ the house (issue 33): the README stays short and opens with the
two set-up commands, every page builds with `mkdocs build --strict` (no broken link or anchor, no
page left out of the nav), the README's links land on pages and headings that exist, and every
metric loadgen defines is on the metrics page with its formula."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from servers import _missing

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
SET_UP = ["pip install -e . && loadgen demo", "scripts/test"]


def fenced_blocks(text: str) -> list[list[str]]:
    """The lines inside each ``` fence, in order."""
    blocks, current = [], None
    for line in text.splitlines():
        if line.startswith("```"):
            if current is None:
                current = []
            else:
                blocks.append(current)
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def test_the_readme_is_short_and_opens_with_the_two_set_up_commands():
    text = README.read_text()
    assert len(text.splitlines()) <= 150
    assert fenced_blocks(text)[0] == SET_UP


def test_fenced_blocks_reads_the_blocks_in_order():
    assert fenced_blocks("a\n```\nx\ny\n```\nb\n```yaml\nz\n```\n") == [["x", "y"], ["z"]]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The docs built with `mkdocs build --strict` into a temporary folder, never into the repo."""
    if importlib.util.find_spec("mkdocs") is None:
        _missing("mkdocs", "pip install -e '.[dev]'")
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(ROOT / "mkdocs.yml"), "--site-dir", str(out)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_every_page_builds_strictly_and_is_in_the_nav(site):
    pages = {p.stem for p in DOCS.glob("*.md")}
    built = {p.parent.name for p in site.glob("*/index.html")} | {"index"}
    assert pages <= built


def test_the_readmes_links_to_docs_land_on_pages_and_headings_that_exist(site):
    links = re.findall(r"\]\(docs/([\w-]+)\.md(?:#([\w-]+))?\)", README.read_text())
    assert len(links) >= len(list(DOCS.glob("*.md"))) - 1  # every page but the index is linked
    for page, anchor in links:
        assert (DOCS / f"{page}.md").exists(), page
        if anchor:
            html = (site / ("" if page == "index" else page) / "index.html").read_text()
            assert f'id="{anchor}"' in html, f"docs/{page}.md#{anchor}"


def defined_metrics() -> list[str]:
    """Every metric loadgen defines: the run.json key of each per-request `Metric` of
    analysis/metric_defs.py, and the level figures `analysis/metrics.py`'s docstring defines
    (`- name = ...` and `name = ...`)."""
    from loadgen.analysis import metric_defs, metrics

    return [m.key for m in metric_defs.all_metrics()] + \
        re.findall(r"(?:^- |; )(\w+)\s+=", metrics.__doc__, flags=re.MULTILINE)


def test_every_metric_defined_is_on_the_metrics_page():
    names = defined_metrics()
    # The metrics as defined when this test was: the parse must find at least these.
    assert {"latency_ms", "latency_uncorrected_ms", "schedule_lag_ms", "ttft_ms", "ttft_queue_ms",
            "tpot_ms", "itl_ms", "service_ms", "queue_wait_ms", "decode_tok_s_mean", "wall_s", "output_tokens",
            "throughput_tok_s", "achieved_rate", "concurrency_reached", "connections_opened",
            "connect_ms"} <= set(names)
    page = (DOCS / "metrics.md").read_text()
    assert [n for n in names if f"`{n}`" not in page] == []


def test_the_metrics_page_shows_each_definitions_formula_as_written_from_them():
    """docs/metrics.md's per-request table is metric_defs.docs_table() (scripts/metrics-doc writes it)."""
    from loadgen.analysis import metric_defs

    page = (DOCS / "metrics.md").read_text()
    block = re.search(r"<!-- metric_defs: begin .*?-->\n(.*?)<!-- metric_defs: end -->", page, flags=re.S)
    assert block is not None, "docs/metrics.md lost its metric_defs block"
    assert block.group(1) == metric_defs.docs_table(), "run scripts/metrics-doc"
    for m in metric_defs.all_metrics():
        assert m.formula in block.group(1), m.name


def test_docs_examples_give_the_port_flag_the_command_has() -> None:
    """`loadgen sweep --port 8080` is no option (it is --ports); `loadgen sim --port` is."""
    import click

    from loadgen.cli.main import cli as main

    wrong = []
    for page in sorted(DOCS.glob("*.md")):
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            match = re.search(r"\bloadgen ([a-z][a-z-]*)\b.*?(--ports?) \d", line)
            if match is None:
                continue
            command = main.get_command(click.Context(main), match[1])
            if command is not None and match[2] not in {o for p in command.params for o in p.opts}:
                wrong.append(f"{page.name}:{n}: loadgen {match[1]} {match[2]}")
    assert not wrong, wrong
