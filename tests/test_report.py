"""`loadgen report` on a committed real sweep (tests/data/sweep-smollm2)."""

from __future__ import annotations

import base64
import json
import shutil
import struct
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from click.testing import CliRunner

from loadgen.cli.report import report_command
from loadgen.output.html import SECTIONS

FIXTURE = Path(__file__).parent / "data" / "sweep-smollm2"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
VOID = {"meta", "img", "br", "hr", "link", "input", "col", "area", "base", "source", "wbr"}


class PageParser(HTMLParser):
    """Checks that every element is closed in order; collects section ids, images and text."""

    def __init__(self):
        super().__init__()
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.sections: list[str] = []
        self.images: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "section":
            self.sections.append(attrs.get("id"))
        if tag == "img":
            self.images.append(attrs.get("src") or "")
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack.pop() != tag:
            self.errors.append(f"unexpected </{tag}>")

    def handle_data(self, data):
        self.text.append(data)


def parse(html_text: str) -> PageParser:
    parser = PageParser()
    parser.feed(html_text)
    parser.close()
    assert not parser.errors and not parser.stack, (parser.errors, parser.stack)
    return parser


def png_size(data: bytes) -> tuple[int, int]:
    assert data.startswith(PNG_SIGNATURE) and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def report(*args: str):
    return CliRunner().invoke(report_command, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def html_report(tmp_path_factory):
    """The static page: PNG charts inlined, no JavaScript."""
    out = tmp_path_factory.mktemp("report") / "report.html"
    result = report(str(FIXTURE), "--output", str(out), "--static")
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def interactive_report(tmp_path_factory):
    """The default page: Plotly charts with plotly.js inlined."""
    pytest.importorskip("plotly", reason="the interactive report needs the report extra (plotly)")
    out = tmp_path_factory.mktemp("interactive") / "report.html"
    result = report(str(FIXTURE), "--output", str(out))
    assert result.exit_code == 0, result.output
    return out


def test_html_is_well_formed_with_every_section(html_report):
    page = parse(html_report.read_text(encoding="utf-8"))
    assert page.sections == [section_id for section_id, _, _ in SECTIONS]
    text = " ".join(page.text)
    for _, heading, _ in SECTIONS:
        assert heading in text
    run = json.loads((FIXTURE / "run.json").read_text())
    for sentence in run["targets"][0]["verdict"]["verdict"]:
        assert sentence in text
    assert "incomplete" not in text.lower()


def test_images_are_inlined_pngs_and_written_next_to_the_html(html_report):
    page = parse(html_report.read_text(encoding="utf-8"))
    assert len(page.images) == 5
    for src in page.images:
        assert src.startswith("data:image/png;base64,")
        width, height = png_size(base64.b64decode(src.split(",", 1)[1], validate=True))
        assert width >= 600 and height >= 200
    for section_id in ("throughput", "latency", "percentiles", "probe", "decode"):
        png = html_report.with_name(f"report-{section_id}.png")
        assert png_size(png.read_bytes())[0] >= 600
    # Self-contained: nothing fetched from elsewhere.
    html_text = html_report.read_text(encoding="utf-8")
    assert "http://" not in html_text and "https://" not in html_text and "<script" not in html_text


def test_interactive_page_has_a_plotly_chart_per_section_and_loads_nothing(interactive_report):
    html_text = interactive_report.read_text(encoding="utf-8")
    page = parse(html_text)
    assert page.sections == [section_id for section_id, _, _ in SECTIONS]
    assert page.images == []  # the charts are drawn, not pictures
    for section_id in ("throughput", "latency", "percentiles", "probe", "decode"):
        assert f'id="chart-{section_id}"' in html_text
        assert interactive_report.with_name(f"report-{section_id}.png").is_file()  # the PNGs stay
    # Nothing is loaded from elsewhere: every script is inline, no stylesheet or image link.
    assert "<script src" not in html_text and "<link" not in html_text
    assert html_text.count("<script") == 1 + 5  # plotly.js once, one drawing script per chart


def test_without_plotly_the_report_falls_back_to_png_with_one_line(tmp_path, monkeypatch):
    from loadgen.output import interactive

    monkeypatch.setattr(interactive, "available", lambda: False)
    out = tmp_path / "report.html"
    result = report(str(FIXTURE), "--output", str(out))
    assert result.exit_code == 0, result.output
    notes = [line for line in result.output.splitlines() if not line.startswith(str(tmp_path))]
    assert len(notes) == 1 and "plotly is not installed" in notes[0] and "loadgen[report]" in notes[0]
    html_text = out.read_text(encoding="utf-8")
    assert "<script" not in html_text and len(parse(html_text).images) == 5


def test_incomplete_run_is_labelled(tmp_path):
    copy = tmp_path / "cut-short"
    shutil.copytree(FIXTURE, copy)
    doc = json.loads((copy / "run.json").read_text())
    doc["complete"] = False
    (copy / "run.json").write_text(json.dumps(doc))
    out = tmp_path / "out" / "report.html"
    result = report(str(copy), "--output", str(out))
    assert result.exit_code == 0, result.output
    text = " ".join(parse(out.read_text(encoding="utf-8")).text)
    assert "incomplete" in text
    assert "smollm2 (incomplete)" in text


def test_several_runs_are_overlaid_with_dir_names(tmp_path):
    other = tmp_path / "second"
    shutil.copytree(FIXTURE, other)
    out = tmp_path / "both.html"
    result = report(str(FIXTURE), str(other), "--output", str(out))
    assert result.exit_code == 0, result.output
    text = " ".join(parse(out.read_text(encoding="utf-8")).text)
    assert "sweep-smollm2: smollm2" in text and "second: smollm2" in text


def test_markdown_prints_the_level_table():
    result = report(str(FIXTURE), "--format", "markdown")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| C |"))
    assert set(lines[header + 1]) <= set("|-: ")
    rows = [line for line in lines[header + 2:] if line.startswith("| ")]
    assert [row.split("|")[1].strip() for row in rows] == ["1", "2"]
    assert any(line.startswith("- smollm2 saturates") for line in lines)


@pytest.mark.parametrize("args, message", [
    (["/nonexistent/run"], "no such directory"),
])
def test_bad_input_exits_2_with_one_line(args, message):
    result = CliRunner().invoke(report_command, args)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


def test_matplotlib_is_not_imported_by_the_command_module():
    code = ("import sys, loadgen.cli.report, loadgen.output.exporters; "
            "sys.exit(1 if 'matplotlib' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.mark.browser
def test_report_renders_in_headless_chromium(html_report, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if chromium is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    image = pytest.importorskip("matplotlib.image", reason="matplotlib is needed to read the screenshot")
    shot = tmp_path / "shot.png"
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--no-first-run",
                    f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1200,2000",
                    html_report.resolve().as_uri()],
                   check=True, capture_output=True, timeout=120)
    pixels = image.imread(str(shot))
    assert pixels.shape[0] >= 1000 and pixels.shape[1] >= 1000
    colours = {tuple(p) for p in (pixels[::4, ::4, :3] * 255).astype(int).reshape(-1, 3)}
    assert len(colours) > 50, f"the screenshot looks blank ({len(colours)} colours)"


# The throughput chart's hover shows the level and its tok/s to 2 decimals (run.json: level 2 of
# tests/data/sweep-smollm2 made 8.470048955… tok/s).
HOVERED_LEVEL, HOVERED_TEXT = 2, "2: 8.47 tok/s"

POINT_JS = """(() => {
  const gd = document.getElementById('chart-throughput');
  gd.scrollIntoView();
  const trace = gd._fullData[%s], i = trace.x.indexOf(%s);
  const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis, box = gd.getBoundingClientRect();
  return {x: box.left + xa._offset + xa.c2p(trace.x[i]), y: box.top + ya._offset + ya.c2p(trace.y[i])};
})()"""
HOVER_TEXT_JS = "Array.from(document.querySelectorAll('#chart-throughput .hoverlayer')).map(e => e.textContent).join(' ')"


def visit_and_hover(report_file: Path, profile: Path, trace: int, level: int, expected: str):
    """Open the report in headless Chromium, hover one point of the throughput chart; return the console
    errors, the URLs requested, the modebar buttons and the hover layer's text before and after."""
    import asyncio

    from browser import Browser, chromium_path

    if chromium_path() is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium)")

    async def visit() -> tuple[list[str], list[str], list[str], str, str]:
        async with Browser(profile) as page:
            await page.open(report_file.resolve().as_uri())
            assert await page.evaluate("document.querySelectorAll('.js-plotly-plot').length") == 5
            buttons = await page.evaluate("Array.from(document.querySelectorAll('.modebar-btn'))"
                                          ".map(e => e.getAttribute('data-title'))")
            before = await page.evaluate(HOVER_TEXT_JS)
            point = await page.evaluate(POINT_JS % (trace, level))
            await page.hover(point["x"], point["y"])
            deadline = asyncio.get_running_loop().time() + 30
            text = ""
            while expected not in text and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.1)
                text = await page.evaluate(HOVER_TEXT_JS)
            return page.errors(), page.requested_urls(), buttons, before, text

    return asyncio.run(visit())


@pytest.mark.browser
def test_interactive_report_in_headless_chromium(interactive_report, tmp_path):
    """No console error, no request but the file itself, and a hover shows the point's value."""
    errors, urls, buttons, before, text = visit_and_hover(interactive_report, tmp_path / "profile", 0,
                                                          HOVERED_LEVEL, HOVERED_TEXT)
    assert errors == []
    assert [u for u in urls if not u.startswith("data:")] == [interactive_report.resolve().as_uri()]
    assert "Zoom" in buttons and not any("Share" in b for b in buttons)  # nothing uploads the chart
    assert HOVERED_TEXT not in before
    assert HOVERED_TEXT in text and "smollm2" in text


@pytest.mark.browser
def test_interactive_report_of_a_grid_in_headless_chromium(tmp_path):
    """A grid's cells overlaid: the second cell's point at level 2 shows its own run.json figure."""
    pytest.importorskip("plotly", reason="the interactive report needs the report extra (plotly)")
    from servers import GRID_SERVER, grid

    out = tmp_path / "grid"
    proc = grid("--server", f"{GRID_SERVER} --parallel {{parallel}}", "--param", "parallel=1,2",
                "--concurrency", "1,2", "--requests", "4", "--n-predict", "8", "--warmup", "1", "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    page_file = tmp_path / "grid.html"
    assert report(str(out), "--output", str(page_file)).exit_code == 0
    (cell_run,) = [p.parent for p in out.rglob("run.json") if "c02" in str(p)]
    level = next(lv for lv in json.loads((cell_run / "run.json").read_text())["targets"][0]["levels"]
                 if lv["level"] == 2)
    expected = f"2: {level['throughput_tok_s']:.2f} tok/s"
    errors, urls, _, _, text = visit_and_hover(page_file, tmp_path / "profile", 1, 2, expected)
    assert errors == []
    assert [u for u in urls if not u.startswith("data:")] == [page_file.resolve().as_uri()]
    assert expected in text and "c02" in text


def test_without_out_the_report_goes_into_the_run_and_is_not_overwritten(tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(FIXTURE, copy)
    first = report(str(copy))
    assert first.exit_code == 0, first.output
    assert (copy / "report.html").is_file() and (copy / "report-throughput.png").is_file()
    for args, message in (([str(copy)], "--force"), ([str(copy), str(FIXTURE)], "--out")):
        refused = CliRunner().invoke(report_command, args)
        lines = refused.output.strip().splitlines()
        assert refused.exit_code == 2 and len(lines) == 1 and message in lines[0], refused.output
    assert report(str(copy), "--force").exit_code == 0


def test_the_levels_table_scrolls_inside_its_own_box():
    from loadgen.output.html import CSS

    assert ".table-wrap { overflow-x: auto;" in CSS and "max-width: 100%" in CSS


# ---------------------------------------------------------------- a soak's report

@pytest.fixture(scope="module")
def soak_run(tmp_path_factory):
    """A 3-second streamed soak of a simulated llama-server, in 1-second windows."""
    from servers import LOADGEN, SimProcess

    out = tmp_path_factory.mktemp("soak") / "soak"
    with SimProcess("--profile", "smoke", "--slots", "2", "--time-scale", "0.05") as sim:
        proc = subprocess.run([*LOADGEN, "soak", "--url", sim.url, "--concurrency", "2", "--duration", "3s",
                               "--checkpoint-interval", "1s", "--n-predict", "8", "--stream", "--output", str(out)],
                              capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return out


SOAK_CHARTS = ("throughput-over-time", "latency-over-time", "probe")


def test_a_soak_report_draws_its_windows_and_its_table_static_and_interactive(soak_run, tmp_path):
    run = json.loads((soak_run / "run.json").read_text())
    soak = run["targets"][0]["soak"]
    for args, scripts in ((["--static"], 0), ([], 1 + len(SOAK_CHARTS))):
        if scripts:
            pytest.importorskip("plotly", reason="the interactive report needs the report extra (plotly)")
        out = tmp_path / f"soak{len(args)}.html"
        result = report(str(soak_run), "--output", str(out), *args)
        assert result.exit_code == 0, result.output
        html_text = out.read_text(encoding="utf-8")
        page = parse(html_text)
        assert page.sections == [*SOAK_CHARTS, "soak"]
        assert html_text.count("<script") == scripts
        assert len(page.images) == (0 if scripts else len(SOAK_CHARTS))
        for name in SOAK_CHARTS:
            assert png_size(out.with_name(f"{out.stem}-{name}.png").read_bytes())[0] >= 600
        text = " ".join(page.text)
        # The soak table's figures, as `loadgen analyze` prints them.
        assert f"{soak['throughput_tok_s']:,.2f}" in text and f"{soak['requests_ok']}/0" in text
        assert "Throughput over time" in text and "Soak findings" in text


def test_a_soak_and_a_sweep_are_not_drawn_together(soak_run, tmp_path):
    out = tmp_path / "never.html"
    result = CliRunner().invoke(report_command, [str(soak_run), str(FIXTURE), "--output", str(out)])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and "soak" in lines[0] and "two reports" in lines[0]
    assert not out.exists()


def test_the_soak_timeline_matches_run_json_and_cuts_the_records_by_window(soak_run):
    from loadgen.analysis.metric_defs import TTFT
    from loadgen.output.report_model import RunSource, build_series
    from loadgen.results.reader import load_probe, load_records, load_run

    records = load_records(soak_run)
    (series,) = build_series([RunSource("soak", load_run(soak_run), records, load_probe(soak_run))])
    timeline = series.soak_timeline()
    windows = json.loads((soak_run / "run.json").read_text())["targets"][0]["soak"]["windows"]
    assert timeline.throughput_tok_s == [w["throughput_tok_s"] for w in windows]
    assert timeline.start_s == [w["start_s"] for w in windows]
    counted = [d.count for d in timeline.latency_ms if d is not None]
    assert sum(counted) == sum(r.ok for r in records)  # every successful request lands in one window
    assert timeline.has_ttft and sum(d.count for d in timeline.ttft_ms if d) == sum(bool(TTFT.values(r)) for r in records)
    assert [b - a for a, b, _ in timeline.drift_spans()] == [1.0, 1.0]  # k = 1 of 3 full windows a side


WINDOW_POINT_JS = """(() => {
  const gd = document.getElementById('chart-%s');
  gd.scrollIntoView();
  const trace = gd._fullData[0], i = %d;
  const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis, box = gd.getBoundingClientRect();
  return {x: box.left + xa._offset + xa.c2p(trace.x[i]), y: box.top + ya._offset + ya.c2p(trace.y[i])};
})()"""
LEGEND_ITEM_JS = """(() => {
  document.getElementById('chart-%s').scrollIntoView();
  const box = document.querySelector('#chart-%s .legend .traces .legendtoggle').getBoundingClientRect();
  return {x: box.left + box.width / 2, y: box.top + box.height / 2};
})()"""


@pytest.mark.browser
def test_interactive_report_of_a_soak_in_headless_chromium(soak_run, tmp_path):
    """No console error, no request but the file; a hover shows a window's throughput; the time axes
    have a range slider; a click on a legend entry hides its series."""
    pytest.importorskip("plotly", reason="the interactive report needs the report extra (plotly)")
    import asyncio

    from browser import Browser, chromium_path

    if chromium_path() is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    page_file = tmp_path / "soak.html"
    assert report(str(soak_run), "--output", str(page_file)).exit_code == 0
    window = json.loads((soak_run / "run.json").read_text())["targets"][0]["soak"]["windows"][1]
    expected = f"{window['start_s']:.1f}–{window['end_s']:.1f} s: {window['throughput_tok_s']:.2f} tok/s"
    hover_js = ("Array.from(document.querySelectorAll('#chart-throughput-over-time .hoverlayer'))"
                ".map(e => e.textContent).join(' ')")

    async def visit():
        async with Browser(tmp_path / "profile") as page:
            await page.open(page_file.resolve().as_uri())
            plots = await page.evaluate("document.querySelectorAll('.js-plotly-plot').length")
            sliders = await page.evaluate("[" + ",".join(
                f"document.getElementById('chart-{name}')._fullLayout.xaxis.rangeslider.visible"
                for name in SOAK_CHARTS[:2]) + "]")
            before = await page.evaluate(hover_js)
            point = await page.evaluate(WINDOW_POINT_JS % ("throughput-over-time", 1))
            await page.hover(point["x"], point["y"])
            text = ""
            deadline = asyncio.get_running_loop().time() + 30
            while expected not in text and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.1)
                text = await page.evaluate(hover_js)
            item = await page.evaluate(LEGEND_ITEM_JS % ("latency-over-time", "latency-over-time"))
            for kind in ("mousePressed", "mouseReleased"):
                await page.send("Input.dispatchMouseEvent", type=kind, x=item["x"], y=item["y"], button="left",
                                clickCount=1)
            visible = None
            deadline = asyncio.get_running_loop().time() + 10
            while visible != "legendonly" and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.1)
                visible = await page.evaluate("document.getElementById('chart-latency-over-time')._fullData[0].visible")
            return page.errors(), page.requested_urls(), plots, sliders, before, text, visible

    errors, urls, plots, sliders, before, text, hidden = asyncio.run(visit())
    assert errors == []
    assert [u for u in urls if not u.startswith("data:")] == [page_file.resolve().as_uri()]
    assert plots == len(SOAK_CHARTS) and sliders == [True, True]
    assert expected not in before and expected in text and "smoke-sim" in text
    assert hidden == "legendonly"


# ---------------------------------------------------------------- speculation and reasoning per level
DRAFTED = {"draft_n": 100, "draft_n_accepted": 82, "acceptance": 0.82, "drafted_per_output_token": 1.25}
REJECTED = {"draft_n": 40, "draft_n_accepted": 0, "acceptance": 0.0, "drafted_per_output_token": 0.5}
REASONED = {"reasoning_tokens": 300, "reasoning_share": 0.75,
            "ttfa_ms": {"count": 4, "mean": 50.0, "p50": 48.5, "p90": 60.0, "p99": 61.0, "max": 61.0}}
HALF = {"reasoning_tokens": 10, "reasoning_share": 0.5}
DRAFT_COLUMNS = ["draft accepted", "drafted per out tok"]
REASONING_COLUMNS = ["reasoning share", "TTFA p50 ms"]

# (fields added to levels c=1 and c=2 of tests/data/sweep-smollm2, the extra columns expected, and
# each level's cells under them); written before the code ran.
EXTRA_CASES = [
    ({}, {}, [], {1: [], 2: []}),
    (DRAFTED, {}, DRAFT_COLUMNS, {1: ["82.0%", "1.25"], 2: ["no speculation", "–"]}),
    (REJECTED, DRAFTED, DRAFT_COLUMNS, {1: ["0.0%", "0.50"], 2: ["82.0%", "1.25"]}),  # 0%: drafted, all rejected
    ({}, REASONED, REASONING_COLUMNS, {1: ["none", "–"], 2: ["75%", "48.5"]}),
    ({**DRAFTED, **HALF}, {}, DRAFT_COLUMNS + REASONING_COLUMNS,
     {1: ["82.0%", "1.25", "50%", "–"], 2: ["no speculation", "–", "none", "–"]}),
]


def with_level_fields(tmp_path: Path, first: dict, second: dict) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(FIXTURE, copy)
    doc = json.loads((copy / "run.json").read_text())
    levels = doc["targets"][0]["levels"]
    levels[0].update(first)
    levels[1].update(second)
    (copy / "run.json").write_text(json.dumps(doc))
    return copy


@pytest.mark.parametrize("first, second, columns, cells", EXTRA_CASES)
def test_acceptance_and_reasoning_share_per_level_only_when_a_level_has_them(tmp_path, first, second, columns, cells):
    run = with_level_fields(tmp_path, first, second)
    result = report(str(run), "--format", "markdown")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    header = next(line for line in lines if line.startswith("| C |"))
    names = [c.strip() for c in header.strip("|").split("|")]
    rows = {int(r.split("|")[1]): [c.strip() for c in r.strip("|").split("|")]
            for r in lines if r.startswith("| ") and r.split("|")[1].strip().isdigit()}
    from loadgen.output.html import TABLE_COLUMNS

    assert names == TABLE_COLUMNS[:-1] + columns + TABLE_COLUMNS[-1:]
    for level, expected in cells.items():
        assert rows[level][len(TABLE_COLUMNS) - 1:-1] == expected
    # The HTML page has the same columns and cells.
    out = tmp_path / "page.html"
    assert report(str(run), "--output", str(out), "--static").exit_code == 0
    text = out.read_text(encoding="utf-8")
    for name in DRAFT_COLUMNS + REASONING_COLUMNS:
        assert (f"<th>{name}</th>" in text) == (name in columns)
    for expected in cells.values():
        assert "".join(f"<td>{cell}</td>" for cell in expected) in text
    # The chart of acceptance and reasoning share per level: only when there is something to draw.
    assert ("speculation" in parse(text).sections) == bool(columns)
    assert out.with_name("page-speculation.png").is_file() == bool(columns)
    pytest.importorskip("plotly", reason="the interactive charts need the report extra (plotly)")
    from loadgen.output import interactive
    from loadgen.output.report_model import RunSource, build_series
    from loadgen.results.reader import load_run

    series = build_series([RunSource("run", load_run(run), [], [])])
    drawn = {t.name: list(t.y) for t in interactive.speculation_figure(series).data}
    assert drawn == {f"smollm2 {name}": [None if f.get(key) is None else 100 * f[key] for f in (first, second)]
                     for key, name in (("acceptance", "draft acceptance"), ("reasoning_share", "reasoning share"))
                     if first.get(key) is not None or second.get(key) is not None}


# ---------------------------------------------------------------- attainment and goodput per level (--slo)
def _judged(attainment, passed, req_s, tok_s, misses, most):
    return {"slo": {"judged": 20, "good": 0 if attainment is None else round(20 * attainment), "attainment": attainment,
                    "required": 0.9, "passed": passed, "goodput_req_s": req_s, "goodput_tok_s": tok_s, "misses": misses,
                    "most_missed": most, "ratio": {"ttft": None}, "score": None}}


SLO_PASS = _judged(0.95, True, 2.5, 80.0, {"ttft": 1}, "ttft")
SLO_FAIL = _judged(0.5, False, 1.25, 40.04, {"error": 10}, "error")
SLO_NOTHING = _judged(None, False, 0.0, 0.0, {}, None)  # a level whose every request the client cancelled
SLO_COLUMNS = ["attainment", "goodput req/s", "goodput tok/s", "most missed"]

# (fields added to levels c=1 and c=2, the extra columns expected, each level's cells under them, the
# attainment chart's points in %); written before the code ran.
SLO_CASES = [
    ({}, {}, [], {1: [], 2: []}, None),
    (SLO_PASS, SLO_FAIL, SLO_COLUMNS, {1: ["95%", "2.50", "80.0", "ttft"], 2: ["50% ✗", "1.25", "40.0", "error"]},
     [95.0, 50.0]),
    (SLO_NOTHING, {}, SLO_COLUMNS, {1: ["–", "0.00", "0.0", "–"], 2: ["–", "–", "–", "–"]}, [None]),
    ({**SLO_PASS, **DRAFTED}, {}, SLO_COLUMNS + DRAFT_COLUMNS,
     {1: ["95%", "2.50", "80.0", "ttft", "82.0%", "1.25"], 2: ["–", "–", "–", "–", "no speculation", "–"]}, [95.0]),
]


@pytest.mark.parametrize("first, second, columns, cells, points", SLO_CASES)
def test_attainment_and_goodput_per_level_only_when_the_run_has_an_slo(tmp_path, first, second, columns, cells, points):
    run = with_level_fields(tmp_path, first, second)
    result = report(str(run), "--format", "markdown")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    header = next(line for line in lines if line.startswith("| C |"))
    names = [c.strip() for c in header.strip("|").split("|")]
    rows = {int(r.split("|")[1]): [c.strip() for c in r.strip("|").split("|")]
            for r in lines if r.startswith("| ") and r.split("|")[1].strip().isdigit()}
    from loadgen.output.html import TABLE_COLUMNS

    assert names == TABLE_COLUMNS[:-1] + columns + TABLE_COLUMNS[-1:]
    for level, expected in cells.items():
        assert rows[level][len(TABLE_COLUMNS) - 1:-1] == expected
    out = tmp_path / "page.html"
    assert report(str(run), "--output", str(out), "--static").exit_code == 0
    text = out.read_text(encoding="utf-8")
    for name in SLO_COLUMNS:
        assert (f"<th>{name}</th>" in text) == (name in columns)
    for expected in cells.values():
        assert "".join(f"<td>{cell}</td>" for cell in expected) in text
    # The attainment chart, with the --attainment line: only when a level was judged.
    assert ("slo" in parse(text).sections) == (points is not None)
    assert out.with_name("page-slo.png").is_file() == (points is not None)
    pytest.importorskip("plotly", reason="the interactive charts need the report extra (plotly)")
    from loadgen.output import interactive
    from loadgen.output.report_model import RunSource, build_series
    from loadgen.results.reader import load_run

    series = build_series([RunSource("run", load_run(run), [], [])])
    assert ("slo" in interactive.charts_for(series)) == (points is not None)
    figure = interactive.slo_figure(series)
    assert [list(t.y) for t in figure.data] == ([] if points is None else [points])
    assert [s["y0"] for s in figure.layout.shapes] == ([] if points is None else [90.0])


def test_a_soak_judged_against_an_slo_draws_attainment_per_window(soak_run, tmp_path):
    """The soak's run.json given --slo figures by hand: window attainments 100%, 50%, none judged,
    75%; required 90%. Expected: the chart between latency and the probe, its points those shares."""
    copy = tmp_path / "soak"
    shutil.copytree(soak_run, copy)
    doc = json.loads((copy / "run.json").read_text())
    soak = doc["targets"][0]["soak"]
    shares = [1.0, 0.5, None, 0.75]
    soak["windows"] = [dict(w, judged=0 if a is None else 4, good=0 if a is None else round(4 * a), attainment=a,
                            goodput_req_s=0.0, goodput_tok_s=0.0)
                       for w, a in zip(soak["windows"] * 4, shares)]
    soak["slo"] = {"required": 0.9, "judged": 12, "good": 9, "attainment": 0.75, "passed": False,
                   "goodput_req_s": 3.0, "goodput_tok_s": 24.0, "first_attainment": 1.0, "last_attainment": 0.75,
                   "attainment_change": -0.25, "falling_p": 0.5, "falling": False}
    (copy / "run.json").write_text(json.dumps(doc))
    out = tmp_path / "judged.html"
    result = report(str(copy), "--output", str(out), "--static")
    assert result.exit_code == 0, result.output
    page = parse(out.read_text(encoding="utf-8"))
    assert page.sections == ["throughput-over-time", "latency-over-time", "attainment-over-time", "probe", "soak"]
    assert out.with_name("judged-attainment-over-time.png").is_file()
    text = " ".join(page.text)
    assert "75% ✗" in text and "100% → 75% (within noise)" in text  # the soak table's SLO cells
    pytest.importorskip("plotly", reason="the interactive charts need the report extra (plotly)")
    from loadgen.output import interactive
    from loadgen.output.report_model import RunSource, build_series
    from loadgen.results.reader import load_run

    series = build_series([RunSource("soak", load_run(copy), [], [])])
    figure = interactive.soak_attainment_figure(series)
    assert [list(t.y) for t in figure.data] == [[100.0, 50.0, None, 75.0]]
    assert [s["y0"] for s in figure.layout.shapes] == [90.0]
    plain = build_series([RunSource("soak", load_run(soak_run), [], [])])
    assert "attainment-over-time" not in interactive.charts_for(plain, soak=True)
