"""Tables as data (`Grid`), laid out for a terminal of any width or written as CSV, JSON or Markdown.

A table's figures are never cut. Every column is given a width that holds its widest cell whole;
headers wrap between words instead; a note column (`wrap`) wraps at spaces. When the columns do
not fit the console's width at those widths, the ones that do not fit move, in their order, to a
continuation table that repeats the `key` columns (the level, the target), so every row stays
readable on its own. The widths are fixed before rich draws the table, so rich never shrinks a
column (its last resort cuts cells short with "…").

`Num` keeps a figure's value next to its text: a terminal shows `1,195.2`, CSV and JSON the number.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

FORMATS = ("table", "json", "csv", "markdown")


@dataclass(frozen=True, slots=True)
class Num:
    """A figure: shown with thousands separators and `digits` decimals (`n/a` when None)."""

    value: float | int | None
    digits: int | None = 0  # None: as short as it is exact (a level: 4, 0.5)
    suffix: str = ""

    def __str__(self) -> str:
        if self.value is None:
            return "n/a"
        return f"{self.value:g}" if self.digits is None else f"{self.value:,.{self.digits}f}{self.suffix}"

    def plain(self) -> float | int | str | None:
        if isinstance(self.value, float) and math.isinf(self.value):
            return "inf"  # --rate inf: JSON has no infinity
        if self.value is None or self.digits is None:
            return self.value
        return round(self.value) if self.digits == 0 else round(self.value, self.digits)


Cell = str | Text | Num


@dataclass(frozen=True, slots=True)
class Column:
    title: str  # "\n" marks where a terminal header breaks; CSV and JSON join the lines with a space
    justify: str = "right"
    key: bool = False  # names the row (level, target): repeated in every part of a split table
    wrap: bool = False  # prose (a note): may wrap at spaces; anything else is never broken
    style: str | None = None

    @property
    def name(self) -> str:
        return " ".join(self.title.split())


@dataclass(slots=True)
class Grid:
    title: str
    columns: list[Column]
    rows: list[list[Cell]] = field(default_factory=list)
    section_ends: set[int] = field(default_factory=set)  # indexes of rows a rule follows
    caption: str | None = None  # a line under the table: what a column's figure means
    footnotes: list[str] = field(default_factory=list)  # "[1] ..." lines under it: notes too long for a cell

    def footnote(self, text: str) -> str:
        """The cell that points to `text`, said in full under the table."""
        self.footnotes.append(text)
        return f"[{len(self.footnotes)}]"

    def add_row(self, *cells: Cell, end_section: bool = False) -> None:
        self.rows.append(list(cells))
        if end_section:
            self.end_section()

    def end_section(self) -> None:
        if self.rows:
            self.section_ends.add(len(self.rows) - 1)


def text_of(cell: Cell) -> str:
    return cell.plain if isinstance(cell, Text) else str(cell)


def _widths(grid: Grid) -> list[tuple[int, int]]:
    """Per column (the least width that cuts nothing, the width that wraps nothing)."""
    out = []
    for i, col in enumerate(grid.columns):
        cells = [len(line) for row in grid.rows for line in text_of(row[i]).splitlines() or [""]]
        words = [len(w) for line in col.title.splitlines() for w in line.split()] or [1]
        lines = [len(line) for line in col.title.splitlines()] or [1]
        widest = max(cells, default=1)
        longest_word = max((len(w) for row in grid.rows for w in text_of(row[i]).split()), default=1)
        least = max(max(words), longest_word if col.wrap else widest)
        out.append((least, max(least, widest, max(lines))))
    return out


def _parts(grid: Grid, width: int) -> list[list[int]]:
    """The columns of each table a grid is drawn as: all of them when they fit `width`."""
    sizes = _widths(grid)
    keys = [i for i, c in enumerate(grid.columns) if c.key]
    rest = [i for i, c in enumerate(grid.columns) if not c.key]

    def cost(cols: list[int]) -> int:  # rich's box: two of padding per column, a rule either side of each
        return sum(sizes[i][0] + 3 for i in cols) + 1

    parts: list[list[int]] = []
    current = list(keys)
    for i in rest:
        if len(current) > len(keys) and cost([*current, i]) > width:
            parts.append(current)
            current = list(keys)
        current.append(i)
    parts.append(current)
    return parts


def _spread(grid: Grid, cols: list[int], width: int) -> list[int]:
    """Widths for the columns of one part: each its least, then what is left handed out in order
    until every header and note is unwrapped."""
    sizes = _widths(grid)
    widths = [sizes[i][0] for i in cols]
    spare = width - (sum(widths) + 3 * len(cols) + 1)
    for n, i in enumerate(cols):
        give = max(0, min(spare, sizes[i][1] - widths[n]))
        widths[n] += give
        spare -= give
    return widths


def rich_tables(grid: Grid, width: int) -> list[Table]:
    """The grid as one terminal table, or several when its columns do not fit `width`."""
    parts = _parts(grid, width)
    tables = []
    for n, cols in enumerate(parts):
        title = grid.title if n == 0 else f"{grid.title} (continued)"
        caption = grid.caption if n == 0 else None  # it explains a figure of the first part's
        table = Table(title=escape(title), header_style="bold", caption=escape(caption) if caption else None,
                      caption_justify="left")
        for i, w in zip(cols, _spread(grid, cols, width)):
            col = grid.columns[i]
            table.add_column(col.title, justify=col.justify, width=w, style=col.style,
                             overflow="fold")
        for r, row in enumerate(grid.rows):
            table.add_row(*[row[i] if isinstance(row[i], Text) else str(row[i]) for i in cols],
                          end_section=r in grid.section_ends)
        tables.append(table)
    return tables


def print_table(console: Console, grid: Grid) -> None:
    """The grid as terminal tables (split to fit the width), then its footnotes, one line each."""
    for table in rich_tables(grid, console.width):
        console.print(table)
    for n, text in enumerate(grid.footnotes, 1):  # one line each in a file or pipe, for grep
        console.print(f"[{n}] {text}", style="dim", highlight=False, markup=False, soft_wrap=not console.is_terminal)


def _plain(cell: Cell) -> Any:
    return cell.plain() if isinstance(cell, Num) else text_of(cell)


def filled_rows(grid: Grid) -> list[list[Cell]]:
    """The rows with every key cell filled in: a terminal shows a level or target on its first row
    only; a row of CSV, JSON or Markdown must name its own."""
    keys = [i for i, c in enumerate(grid.columns) if c.key]
    out, last = [], {}
    for row in grid.rows:
        row = list(row)
        for i in keys:
            if text_of(row[i]) == "" and i in last:
                row[i] = last[i]
            last[i] = row[i]
        out.append(row)
    return out


def grids_json(grids: list[Grid], lines: dict[str, list[str]]) -> str:
    """Every table as {title, columns, rows} (figures as numbers), and the run's lines by kind."""
    return json.dumps({"tables": [{"title": g.title, "columns": [c.name for c in g.columns],
                                   "rows": [[_plain(c) for c in row] for row in filled_rows(g)],
                                   "footnotes": g.footnotes} for g in grids],
                       **lines}, indent=2, ensure_ascii=False) + "\n"


def grids_csv(grids: list[Grid]) -> str:
    """Every table as a CSV block (a `# title` line, a header row, the rows), blocks a blank line apart."""
    blocks = []
    for g in grids:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow([c.name for c in g.columns])
        writer.writerows([_plain(c) for c in row] for row in filled_rows(g))
        notes = "".join(f"# [{n}] {text}\n" for n, text in enumerate(g.footnotes, 1))
        blocks.append(f"# {g.title}\n{buf.getvalue()}{notes}")
    return "\n".join(blocks)


def grids_markdown(grids: list[Grid], lines: list[str]) -> str:
    """Every table as a Markdown table under its title, then the run's lines as a list."""
    out = []
    for g in grids:
        out += [f"### {g.title}", "", "| " + " | ".join(c.name for c in g.columns) + " |",
                "| " + " | ".join("---" if c.justify == "left" else "---:" for c in g.columns) + " |"]
        out += ["| " + " | ".join(text_of(c).replace("|", "\\|") for c in row) + " |" for row in filled_rows(g)]
        out += [f"_{g.caption}_" if g.caption else "", *[f"[{n}] {t}  " for n, t in enumerate(g.footnotes, 1)], ""]
    out += [f"- {line}" for line in lines]
    return "\n".join(out).rstrip("\n") + "\n"
