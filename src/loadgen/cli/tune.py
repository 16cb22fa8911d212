"""`loadgen tune`: the server flags that serve the most users within your latency targets, found without
measuring every cell of the grid in full (issue 48, first slice; docs/tune.md).

Three stages over grid's machinery (cli/grid.py: a server per cell, started and stopped by pid):
1. feasible first, for free: with `--memory`, a llama-server cell whose weights and KV cache alone
   exceed it is never started (grid `--memory`);
2. the screen (TUNE/screen, a grid): every cell's short capacity search (`--repeat 1 --budget N`);
   the best `--finalists` by the screen's answer race on (analysis/tune_plan.py; ties at the cut kept);
3. the final (TUNE/final, a grid): the finalists' full capacity searches with the user's options,
   `--final-repeat` runs each, interleaved; the winner is grid's best cell (analysis/grid_capacity.py),
   named only when its lead is outside the spread of the repeats, else a tie.
tune.json (atomic, after each stage) keeps every cell's stage, status (infeasible, failed, dropped,
finalist, winner) and reason, its server seconds, the winner's params and command line, and the
server seconds the search used against an estimate of the full grid's. `--resume TUNE` continues an
interrupted search: each stage's grid skips the runs it finished.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click
import msgspec
from rich.console import Console

from ..analysis.kv import MIB
from ..analysis.tune_plan import (
    DROPPED,
    FINALIST,
    Pick,
    Screened,
    final_entrants,
    final_runs,
    next_round,
    screen_bar,
    seconds_between,
    start_level,
)
from ..core.errors import EXIT_FAILED, ConfigError
from ..core.griddoc import GridCell, GridDocument
from ..core.signals import LATCH
from .common import user_errors
from .grid import check_measure_args, new_grid, parse_port_range, run_grid
from .help import command
from .kv import parse_size
from .options import Duration
from .shared import checking_only
from .shared import console as _console

if TYPE_CHECKING:
    from ..analysis.grid_capacity import BestCell

TUNE_FILE = "tune.json"
SCREEN, FINAL = "screen", "final"
WINNER, INFEASIBLE_OR_FAILED, UNTRIED = "winner", ("infeasible", "failed"), "untried"


class TuneCell(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One cell of the search as tune.json keeps it."""

    id: str
    name: str
    params: dict[str, str]
    stage: str  # the last stage it reached: screen or final
    status: str  # infeasible, failed, untried (--budget), dropped, finalist, winner
    reason: str | None = None
    screen: str | None = None  # the screen's answers, round by round ("≥4 → 6")
    final: str | None = None  # the final's answer over its repeats
    server_s: float = 0.0


class TuneWinner(msgspec.Struct):
    params: dict[str, str]
    argv: list[str]  # the template with the winner's values ({port} left as PORT)


class TuneDocument(msgspec.Struct, kw_only=True):
    schema: str = "loadgen.tune"
    schema_version: int = 1
    command: list[str] | None = None
    template: str
    finalists: int
    final_repeat: int
    screen_budget: int
    screen_rounds: int = 1  # the most screen rounds (round r: screen_budget * 2^(r-1) requests a cell)
    measure_args: list[str] = []  # the capacity options as given (the final's; the screen adds its own)
    stage: str  # the stage last finished: none, screen, final
    cells: list[TuneCell] = []
    winner: TuneWinner | None = None  # the winning cell's params and the command line to copy
    tie: bool = False
    tied_with: list[str] = []
    sentence: str | None = None  # the final's best-cell sentence
    server_seconds: float = 0.0
    full_grid_estimate_s: float | None = None  # every feasible cell through the final, by the finals' mean cost
    budget_s: float | None = None  # --budget: the server seconds the whole search may use
    cut: str | None = None  # what the budget left out ("3 cell(s) not screened, 2 final run(s) not run")


def _screen_args(args: tuple[str, ...], budget: int) -> tuple[str, ...]:
    """The user's capacity options with the screen's own (the last of a repeated option wins in click)."""
    return (*args, "--repeat", "1", "--budget", str(budget))


def check_tune_args(args: tuple[str, ...]) -> None:
    """Capacity options tune sets itself per stage are refused, not silently overridden."""
    given = {a.split("=")[0] for a in args}
    if "--repeat" in given:
        raise ConfigError("--repeat: tune sets it per stage (the screen 1, the final --final-repeat)")
    if "--at-least" in given:
        raise ConfigError("--at-least: tune sets it in the screen (a cell checked against the bar)")


def _server_s(cell: GridCell) -> float:
    return sum(seconds_between(r.started_utc, r.finished_utc) for r in cell.runs)


def option_value(args: list[str] | tuple[str, ...], name: str, default: str) -> str:
    """The value a capacity option has in `args` (`--name V` or `--name=V`; the last one wins, as in click)."""
    value = default
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value


def _noise(args: list[str]) -> float:
    from ..analysis.capacity_search import DEFAULT_NOISE

    return float(option_value(args, "--noise", str(DEFAULT_NOISE)))


def _starts(grid: GridDocument, cells: tuple[str, ...]) -> dict[str, list[str]]:
    """Each cell's own capacity options for its next search: `--start` at its answer in `grid` (tune_plan
    `start_level`), none when nothing passed."""
    by_rate = option_value(grid.measure_args, "--by", "concurrency") == "rate"
    lows = {s.cell: s.low for s in _screened(grid)}
    out = {}
    for cell in cells:
        start = start_level(lows.get(cell), by_rate)
        out[cell] = ["--start", f"{start:g}"] if start is not None else []
    return out


def _pick(grid: GridDocument, doc: TuneDocument) -> Pick:
    return final_entrants(_screened(grid), doc.finalists, _noise(doc.measure_args))


def _screened(grid: GridDocument) -> list[Screened]:
    from ..analysis.grid_capacity import run_answer

    top = float(option_value(grid.measure_args, "--max-concurrency", "64"))
    out = []
    for cell in grid.cells:
        answers = [r.capacity for r in cell.runs if r.status == "ok" and r.capacity is not None]
        failed = next((r for r in cell.runs if r.status != "ok"), None)
        answer = run_answer(answers[0]) if answers else None
        low = answer.low if answer else None
        reason = f"{failed.status}: {failed.reason}" if failed is not None and low is None else None
        censored = bool(answer and math.isinf(answer.upper) and answer.low < top)  # the cap passed: no more to find
        barred = (float(option_value(cell.measure_args or [], "--start", "1"))
                  if answer is not None and answer.low == 0 and "--at-least" in (cell.measure_args or []) else None)
        out.append(Screened(cell.id, cell.name, low, reason, censored, answer.upper if answer else math.inf, barred))
    return out


def bar_check(doc: TuneDocument, grid: GridDocument, err: Console) -> Callable[[GridCell], None]:
    """The screen's first round, before each cell: its search starts at the bar the cells before it set
    (tune_plan `screen_bar`, capacity `--start BAR --at-least`: a bar that fails ends it), or from the
    search's own start while there is none or the user's --start is higher."""
    by_rate = option_value(doc.measure_args, "--by", "concurrency") == "rate"
    given = float(option_value(doc.measure_args, "--start", "1"))
    noise = _noise(doc.measure_args)

    def before(cell: GridCell) -> None:
        lows = [s.low for s in _screened(grid) if s.cell != cell.id]
        bar = screen_bar(lows, doc.finalists, noise, by_rate)
        cell.measure_args = ["--start", f"{bar:g}", "--at-least"] if bar is not None and bar > given else None
        if cell.measure_args:
            err.print(f"tune: {cell.name} checked against the bar, {bar:g} first: below it, it is dropped",
                      highlight=False)

    return before


def round_name(r: int) -> str:
    """A screen round's folder: screen, screen2, screen3, ..."""
    return SCREEN if r == 1 else f"{SCREEN}{r}"


def build_tune(doc: TuneDocument, screens: list[GridDocument], final: GridDocument | None,
               interrupted: bool = False) -> TuneDocument:
    """tune.json's content from the stages' grids as they stand (`screens`: the screen's rounds)."""
    from ..analysis.grid_capacity import ALONE, BEST, UNTESTED, best_cell, cell_capacity, run_answer

    picks = [_pick(g, doc) for g in screens]
    round_cells = [{c.id: c for c in g.cells} for g in screens]  # per round: its cells by id
    final_cells = {c.id: c for c in (final.cells if final is not None else [])}
    planned = final.repeat if final is not None else doc.final_repeat  # runs per finalist (tune_plan final_runs)
    best = best_cell([cell_capacity(c.name, [r.capacity for r in c.runs if r.status == "ok"])
                      for c in final_cells.values()]) if final_cells else None
    cells = []
    for cell in screens[0].cells:
        rounds = [(by_id[cell.id], pick) for by_id, pick in zip(round_cells, picks) if cell.id in by_id]
        answers = [next((run_answer(r.capacity) for r in c.runs if r.status == "ok" and r.capacity), None)
                   for c, _ in rounds]
        entry = TuneCell(id=cell.id, name=cell.name, params=cell.params, stage=SCREEN, status=DROPPED,
                         screen=" → ".join(a.text if a else "-" for a in answers) if any(answers) else None,
                         server_s=round(sum(_server_s(c) for c, _ in rounds), 1))
        failed = next((r for r in cell.runs if r.status in INFEASIBLE_OR_FAILED), None)
        last, last_pick = rounds[-1]
        if not cell.runs or all(r.status == "interrupted" for r in cell.runs):
            entry.status, entry.reason = UNTRIED, _untried(doc, interrupted)
        elif failed is not None and not answers[0]:
            entry.status, entry.reason = failed.status, failed.reason
        elif cell.id in last_pick.dropped:
            entry.reason = last_pick.dropped[cell.id] + (f" (round {len(rounds)})" if len(rounds) > 1 else "")
        if cell.id in final_cells:
            fcell = final_cells[cell.id]
            entry.stage, entry.status = FINAL, FINALIST
            entry.final = cell_capacity(fcell.name, [r.capacity for r in fcell.runs if r.status == "ok"]).text
            entry.server_s = round(entry.server_s + _server_s(fcell), 1)
            alone = best is not None and best.kind == ALONE and len(final_cells) == 1  # the screen separated the rest
            if best is not None and (best.kind in (BEST, UNTESTED) or alone) and best.best == fcell.name:
                entry.status = WINNER
            done = sum(1 for r in fcell.runs if r.status == "ok")
            if done < planned and doc.budget_s is not None and doc.stage == FINAL:
                entry.reason = f"{done} of {planned} final run(s): the --budget was spent"
        cells.append(entry)
    winner = next((c for c in cells if c.status == WINNER), None)
    # the command to copy: the template with the winner's values (not grid's port and -lv additions)
    from ..analysis.grid_cells import render

    command = render(doc.template, winner.params, port="PORT") if winner else None
    spent = sum(c.server_s for c in cells)
    finals = [seconds_between(r.started_utc, r.finished_utc) for c in final_cells.values() for r in c.runs
              if r.status == "ok"]
    # the full grid at the final's settings: every cell that ran gets final_repeat full searches at the
    # finals' mean cost; a cell that failed or was never started costs what it cost here
    ran = sum(1 for c in cells if c.status not in INFEASIBLE_OR_FAILED)
    lost = sum(c.server_s for c in cells if c.status in INFEASIBLE_OR_FAILED)
    estimate = round(ran * doc.final_repeat * sum(finals) / len(finals) + lost, 1) if finals else None
    cut = _cut(doc, cells, list(final_cells.values()), planned)
    return msgspec.structs.replace(
        doc, cut=cut if doc.budget_s is not None and not interrupted else None,
        cells=cells, winner=TuneWinner(winner.params, command) if winner and command else None,
        tie=bool(best and best.kind == "tie"), tied_with=list(best.tied) if best and best.kind == "tie" else [],
        sentence=_sentence(best, picks[-1], cells, screens[-1]) if best else None, server_seconds=round(spent, 1), full_grid_estimate_s=estimate)


def _untried(doc: TuneDocument, interrupted: bool) -> str:
    """Why a cell was not screened: the search was stopped, or the --budget was spent before it."""
    if interrupted:
        return "not screened: the search was interrupted (--resume screens it)"
    return f"not screened: the --budget of {doc.budget_s:g} s was spent" if doc.budget_s is not None \
        else "not screened yet"


def _cut(doc: TuneDocument, cells: list[TuneCell], finals: list[GridCell], planned: int) -> str | None:
    """What the --budget left out: cells never screened, final runs never run (None: nothing)."""
    untried = sum(1 for c in cells if c.status == UNTRIED)
    short = (sum(max(0, planned - sum(1 for r in c.runs if r.status == "ok")) for c in finals)
             if doc.stage == FINAL else 0)
    return ", ".join(part for part in (f"{untried} cell(s) not screened" if untried else "",
                                       f"{short} final run(s) not run" if short else "") if part) or None


def _sentence(best: BestCell, pick: Pick, cells: list[TuneCell], last: GridDocument) -> str:
    """The final's best-cell sentence; with one finalist, what the screen said of the runner-up."""
    from ..analysis.grid_capacity import ALONE

    separated = [c for c in cells if c.id in pick.dropped and "not searched again" in pick.dropped[c.id]]
    if best.kind != ALONE or not separated:
        return best.sentence
    lows = {s.cell: s.low or 0.0 for s in _screened(last)}
    runner = max(separated, key=lambda c: lows.get(c.id, 0.0))
    return (f"{best.sentence}; the runner-up, {runner.name} (screen {runner.screen}), is below it beyond the noise "
            "by the screen, not searched again")


def write_tune(root: Path, doc: TuneDocument) -> None:
    from ..results.atomic import write_json

    write_json(root / TUNE_FILE, msgspec.to_builtins(doc))


@command("tune", context_settings={"ignore_unknown_options": True})
@click.option("--server", "template", help="The server's command line with {name} placeholders, as grid's.")
@click.option("--param", "param_texts", multiple=True, metavar="NAME=V1,V2",
              help="A placeholder's values (repeatable); the space is every combination.")
@click.option("--memory", "memory_text", metavar="SIZE",
              help="Memory for weights and caches (24GiB): a llama-server cell that cannot fit is never started.")
@click.option("--finalists", type=click.IntRange(min=1), default=2, show_default=True,
              help="Cells that race in the final (a tie at the cut races too).")
@click.option("--final-repeat", type=click.IntRange(min=1, max=20), default=2, show_default=True,
              help="Full capacity searches per finalist, interleaved; 2 or more to tell a lead from noise.")
@click.option("--screen-budget", type=click.IntRange(min=8), default=120, show_default=True,
              help="Requests of each cell's screening capacity search.")
@click.option("--screen-rounds", type=click.IntRange(1, 6), default=3, show_default=True,
              help="Screen rounds at most: cells tied at the cut because their short search stopped below their "
                   "capacity are screened again with twice the budget.")
@click.option("--budget", "budget_s", type=Duration(), metavar="DURATION",
              help="Server time the whole search may use (30m, 2h): no run starts that would pass it; what was "
                   "left out is said.")
@click.option("--wait-ready", "wait_ready_s", type=click.FloatRange(min=0), default=600, show_default=True,
              help="Seconds a server may take to load its model before its cell counts as failed.")
@click.option("--port-range", callback=lambda ctx, param, value: parse_port_range(value), metavar="FIRST-LAST",
              help="Ports a cell's server may listen on; default: any free port.")
@click.option("--output", type=click.Path(file_okay=False), help="Tune folder [default: results/<UTC time>-tune].")
@click.option("--force", is_flag=True, help="Overwrite a folder that already holds results.")
@click.option("--resume", type=click.Path(file_okay=False), help="Continue an interrupted search in this folder.")
@click.argument("measure_args", nargs=-1, type=click.UNPROCESSED, metavar="[CAPACITY OPTIONS]")
def tune_command(template, param_texts, memory_text, finalists, final_repeat, screen_budget, screen_rounds, budget_s,
                 wait_ready_s, port_range, output, force, resume, measure_args) -> None:
    """Find the server flags that serve the most users within latency targets (--slo): screen every cell, race the best."""
    from ..results.grid_file import is_grid, load_grid, write_grid
    from ..results.writer import command_line, default_dir, prepare_dir

    with user_errors():
        if resume:
            root = Path(resume)
            doc = msgspec.json.decode((root / TUNE_FILE).read_bytes(), type=TuneDocument) \
                if (root / TUNE_FILE).is_file() else None
            if doc is None or not is_grid(root / SCREEN):
                raise ConfigError(f"{root}: no tune.json and screen grid to continue; start a new search")
            if template or param_texts or measure_args or budget_s is not None:
                raise ConfigError("--resume continues a search as it was given; leave out --server, --param, "
                                  "--budget and the capacity options")
            screen = load_grid(root / SCREEN)
        else:
            if not template or not param_texts:
                raise ConfigError("give --server 'COMMAND with {placeholders}' and --param NAME=V1,V2 (or --resume DIR)")
            memory_mib = parse_size(memory_text) / MIB if memory_text is not None else None
            screen = new_grid(template, param_texts, 1, "capacity", _screen_args(measure_args, screen_budget),
                              wait_ready_s, port_range, memory_mib)
            doc = TuneDocument(command=command_line(), template=template, finalists=finalists,
                               final_repeat=final_repeat, screen_budget=screen_budget,
                               screen_rounds=screen_rounds, budget_s=budget_s,
                               measure_args=list(measure_args), stage="none")
    check_measure_args("capacity", tuple(screen.measure_args))
    check_tune_args(tuple(doc.measure_args))
    if checking_only():
        return
    with user_errors():
        if not resume:
            root = prepare_dir(Path(output) if output else default_dir(Path("results"), "tune"), force)
            if (root / TUNE_FILE).exists() or is_grid(root / SCREEN):
                if not force:
                    raise ConfigError(f"{root} already holds a tune; continue it with --resume {root} or add --force")
                import shutil

                for stage in (*(round_name(r) for r in range(1, 7)), FINAL):  # --force: the earlier stages only
                    shutil.rmtree(root / stage, ignore_errors=True)
            (root / SCREEN).mkdir(exist_ok=True)
            write_grid(root / SCREEN, screen)
            write_tune(root, doc)
    LATCH.install()
    run_stages(root, doc, screen)


def within_budget(doc: TuneDocument, grids: list[GridDocument], stage: GridDocument,
                  err: Console) -> Callable[[], bool] | None:
    """Asked before each run of `stage`: whether the server seconds used so far (every grid of the search)
    and the stage's mean run (none yet: nothing) stay within --budget; says so once when they would
    not. None without --budget."""
    budget = doc.budget_s
    if budget is None:
        return None
    said: list[bool] = []

    def keep_going() -> bool:
        used = sum(_server_s(c) for g in grids for c in g.cells)
        runs = [seconds_between(r.started_utc, r.finished_utc) for c in stage.cells for r in c.runs]
        if used + (sum(runs) / len(runs) if runs else 0.0) <= budget:
            return True
        if not said:
            said.append(True)
            err.print(f"tune: the --budget of {budget:g} s is spent ({used:.0f} s used); the rest is not run",
                      style="yellow", highlight=False)
        return False

    return keep_going


def screen_rounds(root: Path, doc: TuneDocument, screen: GridDocument, err: Console) -> list[GridDocument]:
    """The screen's rounds, run (or continued) in turn: round 1 every cell; round r+1, with twice round
    r's budget, the cells `next_round` sends on, while --screen-rounds allows. Their grids, in order."""
    from ..results.grid_file import is_grid, load_grid, write_grid

    rounds = [screen]
    while True:
        r, grid = len(rounds), rounds[-1]
        if r > 1:
            err.print(f"tune: screen round {r}: {len(grid.cells)} cell(s) at the cut or censored below it, "
                      f"{doc.screen_budget * 2 ** (r - 1)} requests each", highlight=False)
        run_grid(root / round_name(r), grid, err, within_budget(doc, rounds, grid, err),
                 bar_check(doc, grid, err) if r == 1 else None)
        advance = next_round(_screened(grid), doc.finalists)
        if LATCH.received or not advance or r >= doc.screen_rounds:
            return rounds
        folder = root / round_name(r + 1)
        if is_grid(folder):
            nxt = load_grid(folder)
        else:
            by_id, starts = {c.id: c for c in grid.cells}, _starts(grid, advance)
            nxt = msgspec.structs.replace(
                grid, measure_args=list(_screen_args(tuple(doc.measure_args), doc.screen_budget * 2 ** r)),
                cells=[GridCell(id=c, name=by_id[c].name, params=by_id[c].params, runs=[], measure_args=starts[c])
                       for c in advance])
            folder.mkdir(exist_ok=True)
            write_grid(folder, nxt)
        rounds.append(nxt)


def run_stages(root: Path, doc: TuneDocument, screen: GridDocument) -> None:
    """The screen's rounds, the pick, the final, tune.json after each; prints the search and exits
    (130/143 when interrupted: --resume continues it)."""
    from ..analysis.grid_cells import render
    from ..results.grid_file import is_grid, load_grid, write_grid

    err = _console(stderr=True)
    started = time.monotonic()
    err.print(f"tune: screening {len(screen.cells)} cell(s), a capacity search of {doc.screen_budget} requests each",
              highlight=False)
    screens = screen_rounds(root, doc, screen, err)
    final = load_grid(root / FINAL) if is_grid(root / FINAL) else None
    if not LATCH.received:
        doc = msgspec.structs.replace(doc, stage=SCREEN)
        last = screens[-1]
        pick = _pick(last, doc)
        if final is None and pick.finalists:
            by_id, starts = {c.id: c for c in last.cells}, _starts(last, pick.finalists)
            final = msgspec.structs.replace(
                screen, repeat=final_runs(len(pick.finalists), doc.final_repeat), measure_args=list(doc.measure_args),
                cells=[GridCell(id=c, name=by_id[c].name, params=by_id[c].params, runs=[], measure_args=starts[c])
                       for c in pick.finalists])
            for cell in final.cells:
                render(final.template, cell.params)
            (root / FINAL).mkdir(exist_ok=True)
            write_grid(root / FINAL, final)
        write_tune(root, build_tune(doc, screens, final, bool(LATCH.received)))
        if final is not None:
            err.print(f"tune: {len(final.cells)} finalist(s), {final.repeat} full capacity search(es) each",
                      highlight=False)
            run_grid(root / FINAL, final, err, within_budget(doc, [*screens, final], final, err))
            if not LATCH.received:
                doc = msgspec.structs.replace(doc, stage=FINAL)
    doc = build_tune(doc, screens, final, bool(LATCH.received))
    write_tune(root, doc)
    print_tune(doc)
    err.print(f"tune: {root} ({time.monotonic() - started:.0f} s)", highlight=False)
    if LATCH.received:
        err.print(f"tune: interrupted; continue with loadgen tune --resume {root}", highlight=False)
        sys.exit(LATCH.exit_code or EXIT_FAILED)
    if not any(c.status in (FINALIST, WINNER) for c in doc.cells):
        err.print("tune: no cell could be measured (every one failed or was infeasible): see the reasons above",
                  style="red", highlight=False)
        sys.exit(EXIT_FAILED)
    sys.exit(0)


def print_tune(doc: TuneDocument) -> None:
    from rich.table import Table

    table = Table(title="tune: every cell tried")
    for name in ("cell", "stage", "status", "screen", "final", "server s", "why"):
        table.add_column(name)
    for c in doc.cells:
        table.add_row(c.name, c.stage, c.status, c.screen or "-", c.final or "-", f"{c.server_s:.0f}", c.reason or "")
    console = _console()
    console.print(table)
    if doc.sentence:
        console.print(doc.sentence, highlight=False, markup=False)
    if doc.winner is not None:
        import shlex

        console.print("winner's command line: " + shlex.join(doc.winner.argv), highlight=False, markup=False,
                      soft_wrap=True)
    elif doc.tie:
        console.print(f"a tie between {', '.join(doc.tied_with)}: no winner is named", highlight=False, markup=False)
    if doc.cut:
        console.print(f"cut by the --budget of {doc.budget_s:g} s: {doc.cut}; the answer is among the cells tried",
                      highlight=False, markup=False)
    estimate = f" (the full grid: about {doc.full_grid_estimate_s:,.0f} s)" if doc.full_grid_estimate_s else ""
    console.print(f"server time used: {doc.server_seconds:,.0f} s{estimate}", highlight=False, markup=False)
