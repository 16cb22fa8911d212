"""Energy per token where people look: the sweep table's columns, the report's level table and chart,
and the live metrics, each equal to run.json's figures. A stand-in llama-server adds n J to the RAPL
package counter of a built sysfs tree as the n-th completion arrives (none while idle), and lowers
the power limit at completion 9, so every figure is known exactly:

    level 1 (completions 1-6):  21 J / (6 × 16 tokens) = 0.21875 J/token
    level 2 (completions 7-12): 57 J / 96 tokens        = 0.59375 J/token, and its machine changed
"""

from __future__ import annotations

import csv
import json
import threading
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from loadgen.core.rundoc import RunDocument
from loadgen.output.report_model import RunSource, build_series
from machine_tree import build_tree, set_energy, set_rapl_limit
from servers import free_port, run_cli
from test_env_sweep import StandIn


def _series(doc):
    """A report's series of one run (a run.json dict or the typed document), without records."""
    return build_series([RunSource("r", doc if isinstance(doc, RunDocument) else RunDocument.of(doc), [], [])])

JOULES = {1: 21.0, 2: 57.0}  # Σ n over each level's completions
TOKENS = 6 * 16




class _Scraper:
    """Scrapes loadgen's live metrics on `port` over and over while inside; `last()`: the last body read."""

    def __init__(self, port: int):
        self.url, self.bodies, self.done = f"http://127.0.0.1:{port}/metrics", [], threading.Event()
        self.thread = threading.Thread(target=self._scrape)

    def _scrape(self) -> None:
        while not self.done.is_set():
            try:
                with urllib.request.urlopen(self.url, timeout=5) as response:
                    self.bodies.append(response.read().decode())
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.01)

    def __enter__(self) -> _Scraper:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join(30)

    def last(self) -> dict[tuple[str, frozenset], float]:
        return {(s.name, frozenset(s.labels.items())): s.value
                for family in text_string_to_metric_families(self.bodies[-1]) for s in family.samples}


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """(run.json, the sweep's tables as JSON, the last live scrape, the report as Markdown and as HTML,
    the export's levels.csv rows)."""
    tmp = tmp_path_factory.mktemp("energy")
    sysfs, procfs = build_tree(tmp / "m", rapl_uj=0, rapl_limit_w=241, rapl_max_w=241)
    counter = {"uj": 0}

    def spend(n: int) -> None:
        counter["uj"] += n * 1_000_000
        set_energy(sysfs, counter["uj"])
        if n == 9:
            set_rapl_limit(sysfs, 100)

    port = free_port()
    with StandIn(spend) as server, _Scraper(port) as scraper:
        code, out, err = run_cli("sweep", "--url", server.origin, "--label", "s", "--concurrency", "1,2",
                              "--requests", "6", "--warmup", "0", "--probe-interval", "0", "--sysfs", sysfs,
                              "--procfs", procfs, "--env-interval", "0.05", "--idle-power", "0.2",
                              "--output", tmp / "run", "--format", "json", "--prometheus-port", port,
                              "--prometheus-linger", "120")
    assert code == 0, err
    code, markdown, err = run_cli("report", tmp / "run", "--format", "markdown")
    assert code == 0, err
    code, _, err = run_cli("report", tmp / "run", "--static", "--output", tmp / "report.html")
    assert code == 0, err
    code, _, err = run_cli("export", tmp / "run", "--format", "csv", "--output", tmp / "csv")
    assert code == 0, err
    doc = json.loads((tmp / "run" / "run.json").read_text())
    with (tmp / "csv" / "levels.csv").open(newline="") as f:
        levels_csv = list(csv.DictReader(f))
    return doc, json.loads(out), scraper.last(), markdown, (tmp / "report.html").read_text(), levels_csv


def _levels(doc: dict) -> list[dict]:
    return doc["targets"][0]["levels"]


def test_the_stand_in_spent_what_the_docstring_says(measured):
    doc = measured[0]
    for lv in _levels(doc):
        (cpu,) = lv["energy"]
        assert cpu["energy_j"] == pytest.approx(JOULES[lv["level"]])
        assert cpu["j_per_token"] == pytest.approx(JOULES[lv["level"]] / TOKENS)
        assert lv["output_tokens"] == TOKENS
    assert [bool(lv["environment_changed"]) for lv in _levels(doc)] == [False, True]



def _rows(table: dict) -> list[dict]:
    return [dict(zip(table["columns"], row)) for row in table["rows"]]


def test_the_sweep_table_shows_each_levels_energy_and_marks_the_changed_one(measured):
    doc, tables = measured[0], measured[1]
    sweep = next(t for t in tables["tables"] if t["title"] == "loadgen sweep")
    rows = _rows(sweep)
    assert len(rows) == 2
    for row, lv in zip(rows, _levels(doc)):
        (cpu,) = lv["energy"]
        assert (row["J/token"], row["net J/token"], row["mean W"]) == (
            round(cpu["j_per_token"], 3), round(cpu["net_j_per_token"], 3), round(cpu["mean_w"], 1))
    assert [row["machine"] for row in rows] == ["", "changed"]
    assert [line for line in tables["warnings"] if "machine changed" in line] == [
        "warning: s at level 2: the machine changed during the level: RAPL package-0 limits long_term 241 W → "
        "long_term 100 W"]


def test_levels_csv_holds_each_levels_energy_and_what_changed(measured):
    doc, rows = measured[0], measured[5]
    assert len(rows) == 2
    for row, lv in zip(rows, _levels(doc), strict=True):
        (cpu,) = lv["energy"]
        assert row["energy_source"] == "cpu"
        for key in ("energy_j", "mean_w", "j_per_token", "net_j_per_token", "tokens_per_j"):
            assert float(row[key]) == pytest.approx(cpu[key], rel=1e-12), key
        assert row["environment_changed"] == "; ".join(lv["environment_changed"])
    assert rows[1]["environment_changed"].startswith("RAPL package-0 limits long_term 241 W")


def _markdown_rows(text: str) -> list[dict]:
    lines = [line for line in text.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True)) for line in lines[2:]]


def test_the_report_shows_each_levels_energy_and_what_changed(measured):
    doc, markdown, html = measured[0], measured[3], measured[4]
    rows = _markdown_rows(markdown)
    for row, lv in zip(rows, _levels(doc), strict=True):
        (cpu,) = lv["energy"]
        assert (row["J/token"], row["net J/token"], row["mean W"]) == (
            f"{cpu['j_per_token']:.3f}", f"{cpu['net_j_per_token']:.3f}", f"{cpu['mean_w']:.1f}")
    assert [row["machine"] for row in rows] == ["", "changed: " + _levels(doc)[1]["environment_changed"][0]]
    assert '<section id="energy">' in html and "<h2>Energy per level</h2>" in html
    assert f"<td>{_levels(doc)[1]['energy'][0]['j_per_token']:.3f}</td>" in html


def test_the_live_metrics_end_at_run_jsons_energy(measured):
    doc, live = measured[0], measured[2]
    for lv in _levels(doc):
        (cpu,) = lv["energy"]
        labels = frozenset({"target": "s", "level": str(lv["level"]), "source": "cpu"}.items())
        assert live[("loadgen_energy_joules_total", labels)] == pytest.approx(cpu["energy_j"], abs=1e-6)
        assert live[("loadgen_joules_per_token", labels)] == pytest.approx(cpu["j_per_token"], abs=1e-6)
        assert live[("loadgen_power_watts", labels)] == pytest.approx(cpu["mean_w"], abs=1e-6)


# (each level's energy as run.json holds it, the columns' figures expected: J/token, net J/token,
# mean W): the "total" source when there are several, else the only one; net n/a without idle power.
CPU = {"source": "cpu", "seconds": 2.0, "energy_j": 80.0, "mean_w": 40.0, "j_per_token": 0.5, "net_j_per_token": 0.3}
GPU = {"source": "gpu", "seconds": 2.0, "energy_j": 160.0, "mean_w": 80.0, "j_per_token": 1.0, "net_j_per_token": 0.8}
TOTAL = {"source": "total", "seconds": 2.0, "energy_j": 240.0, "mean_w": 120.0, "j_per_token": 1.5,
         "net_j_per_token": 1.1}
SOURCES = [([CPU, GPU, TOTAL], (1.5, 1.1, 120.0)),
           ([{**GPU, "net_j_per_token": None}], (1.0, None, 80.0)),
           (None, (None, None, None))]


def _with_energy(doc: dict, energies: list) -> dict:
    doc = json.loads(json.dumps(doc))
    target = doc["targets"][0]
    target["levels"] = [{**target["levels"][0], "level": i + 1, "concurrency": i + 1, "energy": e,
                         "environment_changed": []} for i, e in enumerate(energies)]
    return doc


def test_the_columns_show_the_total_source_else_the_only_one(measured):
    from loadgen.output.html import markdown
    from loadgen.output.layout import grids_json
    from loadgen.output.tables import sweep_table

    doc = _with_energy(measured[0], [energy for energy, _ in SOURCES])
    table = json.loads(grids_json([sweep_table(doc)], {}))["tables"][0]
    assert [(r["J/token"], r["net J/token"], r["mean W"]) for r in _rows(table)] == [want for _, want in SOURCES]
    assert "machine" not in table["columns"]  # nothing changed: no column
    rows = _markdown_rows(markdown(_series(doc)))
    shown = [[r["J/token"], r["net J/token"], r["mean W"]] for r in rows]
    assert shown == [["1.500", "1.100", "120.0"], ["1.000", "–", "80.0"], ["–", "–", "–"]]


def test_a_run_without_energy_shows_no_energy_column():
    from pathlib import Path

    from loadgen.output.html import Extras
    from loadgen.output.layout import grids_json
    from loadgen.output.tables import sweep_table
    from loadgen.results.reader import load_run

    doc = load_run(Path(__file__).parent / "data" / "sweep-sim-v2")
    columns = json.loads(grids_json([sweep_table(doc)], {}))["tables"][0]["columns"]
    assert columns[-3:] == ["ok req/s", "in tok", "total tok/s"]
    extras = Extras.of(_series(doc))
    assert (extras.energy, extras.changed) == (False, False)


def test_the_energy_charts_plot_run_jsons_figures_and_mark_the_changed_level(measured):
    pytest.importorskip("plotly", reason="the interactive charts need the report extra (plotly)")
    from loadgen.output import charts, interactive

    doc = measured[0]
    series = _series(doc)
    assert "energy" in interactive.charts_for(series) and "energy" in charts.sweep_charts(series)
    traces = {t.name: t for t in interactive.energy_figure(series).data}
    cpu = [lv["energy"][0] for lv in _levels(doc)]
    assert list(traces["s J/token"].y) == [e["j_per_token"] for e in cpu]
    assert list(traces["s mean W"].y) == [e["mean_w"] for e in cpu] and traces["s mean W"].yaxis == "y2"
    assert list(traces["s machine changed"].x) == [2]
    figure = charts.energy_figure(series)  # the PNG twin: the same points
    top, bottom = figure.axes
    assert list(top.lines[0].get_ydata()) == [e["j_per_token"] for e in cpu]
    assert list(bottom.lines[0].get_ydata()) == [e["mean_w"] for e in cpu]
    without = _with_energy(doc, [None])
    assert "energy" not in interactive.charts_for(_series(without))
