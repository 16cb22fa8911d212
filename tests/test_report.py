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
    out = tmp_path_factory.mktemp("report") / "report.html"
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
