"""`loadgen grid`: start a server per configuration, measure it, stop it; then one table of the cells.

Each cell's server is started by loadgen on a free loopback port (`run.servers`: its own process
group, killed with loadgen however loadgen ends), with `--host` and `--port` added unless the
template sets them, and `-lv 4` where the template runs llama-server and sets no verbosity
(`runs_llama_server`; `-lv 4` prints the KV cache lines of the boot log; it also logs about 28
lines per request instead of 7, to a file). Other servers (`loadgen sim`, vLLM) get no `-lv`, and
their cells have no boot-log KV figures. A cell measures only its own server: its port must be
free before the server starts, and once /health answers, every socket listening on that port must be
the server's (`core.ports`; /props' slot count where the system cannot tell); otherwise the cell
fails with "could not bind HOST:PORT (in use)" (a port grid picked itself is tried again with another). The measurement is a fresh `loadgen sweep` (or prefill,
depth) process against it, as `loadgen ab` runs its sweeps, so every cell's folder is a run in
today's format. Before the next cell starts, the server is stopped and its pid checked gone.

With `--measure capacity` (and its `--slo`) the measurement is `loadgen capacity`: grid.json keeps
each run's answer (its capacity.json), the table a capacity column (mean ± sd over the repeats, and
each run's answer), and `analysis.grid_capacity` names the best cell only where its lead is outside
the spread of the repeats, else a tie. With `--measure cache-capacity` it is `loadgen cache-capacity`,
given the cell's server pid (`--server-pid`) and what its command line says of the cache (its
`--cache-ram`, `--no-cache-idle-slots`, a unified KV cache: `cell_measure_args`): grid.json keeps each run's result (its cache-capacity.json), the table
the warm conversations each cell holds beside the prediction, and the best cell is named by the same
rules.

Exit codes: 0 every run of every cell ran; 1 some cell failed (its server did not start, never got
healthy, died, or the measurement failed: each is recorded with the reason and its log's tail, and
the other cells still run); 2 bad input; 130/143 interrupted (the grid so far is kept: `--resume`).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any

import click
import msgspec
from click.core import ParameterSource
from rich.console import Console

from ..analysis.bootlog import boot_facts, boot_failure, log_tail, server_boot
from ..analysis.kv import INFEASIBLE, MIB, does_not_fit, estimate, model_shape
from ..analysis.server_ownership import asked_slots, bind_failure, not_the_cells_server
from ..core.errors import EXIT_FAILED, EXIT_OK, ConfigError, ResultsError, UserError
from ..core.griddoc import (
    BootEntry,
    CacheCapacityEntry,
    GridCell,
    GridDocument,
    GridParamEntry,
    GridRun,
    KvEstimateEntry,
    Measure,
)
from ..core.ports import bind_problem
from ..core.processes import start_tied
from ..core.server_props import ServerProps
from ..core.signals import LATCH
from ..results.reader import load_run
from ..run.gguf_file import read_gguf
from ..run.servers import (
    ServerProcess,
    ServerStartError,
    fallback_notes,
    free_port,
    get_json,
    launch,
    port_holder,
    stop,
    wait_ready,
)
from .common import results_folder, user_errors
from .help import command
from .kv import parse_size
from .shared import CHECK_ONLY, checking_only
from .shared import console as _console

if TYPE_CHECKING:
    from ..analysis.grid_cells import GridParam

MEASURES = ("sweep", "prefill", "depth", "capacity", "cache-capacity")
RESERVED = ("--url", "--ports", "--host", "--label", "--output", "--force")
# Every cell's target label: compare and gate pair targets by label, so the cells of one grid (and
# an `ab` run, whose default label this is) compare; the cell's name is in grid.json.
CELL_LABEL = "server"
PORT_TRIES = 3  # ports grid picks itself for one cell before it counts as failed
PROPS = ("total_slots", "model_alias", "model_path", "build_info")  # what a cell's run keeps of /props
CACHE_RAM_FLAGS = ("--cache-ram", "-cram")  # llama-server's host prompt cache, MiB
# cache-capacity's options grid sets per cell: the server's pid (its RSS), its --cache-ram and modes (the prediction)
CELL_SET = ("--server-pid", "--cache-ram-mib", "--cache-idle-slots", "--no-cache-idle-slots", "--kv-unified")
VERBOSITY_FLAGS = ("-lv", "--verbosity", "--log-verbosity", "-v", "--verbose", "--log-verbose")


def runs_llama_server(argv: list[str]) -> bool:
    """Whether the command runs llama-server: a word of it (the program, or the program a wrapper such
    as `taskset -c 0-7` or `python` runs) has a file name containing "llama-server". Only there does
    grid add `-lv 4`: other servers (`loadgen sim`, vLLM, SGLang) refuse the flag."""
    return any("llama-server" in PurePath(word).name for word in argv if not word.startswith("-"))


def server_argv(template: str, values: dict[str, str],
                port_range: tuple[int, int] | None = None) -> tuple[list[str], str]:
    """The cell's argv with loadgen's additions, and its URL: a free loopback port (of `port_range`
    when given) where the template writes {port}, else as `--port` unless it gives one; the same
    for {host} and `--host` (127.0.0.1); -lv 4 for llama-server."""
    from ..analysis.grid_cells import flag_value, has_flag, placeholders, render

    used, loopback = placeholders(template), "127.0.0.1"
    # a port is picked only when grid places it: a template that gives its own --port keeps it
    # (and never fails on a --port-range it does not use)
    picks = "port" in used or not has_flag(render(template, values), "--port")
    picked = str(free_port(within=port_range)) if picks else ""
    argv = render(template, values, port=picked, host=loopback)
    if not argv:
        raise ConfigError("--server is empty; give the server's command line, e.g. 'llama-server -m {model}'")
    port = picked if "port" in used else flag_value(argv, "--port")
    if port is None:
        port = picked
        argv += ["--port", port]
    host = loopback if "host" in used else flag_value(argv, "--host")
    if host is None:
        host = loopback
        argv += ["--host", host]
    if runs_llama_server(argv) and not has_flag(argv, *VERBOSITY_FLAGS):
        argv += ["-lv", "4"]  # the boot log's KV cache lines need it
    return argv, f"http://{host}:{port}"


def parse_port_range(text: str | None) -> tuple[int, int] | None:
    """"9000-9010" -> (9000, 9010); click's one-line usage error for anything else."""
    if text is None:
        return None
    first, sep, last = text.partition("-")
    try:
        low, high = int(first), int(last)
    except ValueError:
        low = high = -1
    if not sep or not 1024 <= low <= high <= 65535:
        raise click.BadParameter(f"{text!r}: write FIRST-LAST, two ports from 1024 to 65535, e.g. 9000-9010")
    return low, high


def ended(what: str, code: int) -> str:
    """"sweep exited with code 1", or "sweep was killed by SIGKILL" for a negative return code (a
    signal: the kernel's OOM killer sends SIGKILL)."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"{what} was killed by {name}" + (" (out of memory?)" if -code == signal.SIGKILL else "")
    return f"{what} exited with code {code}"


def kv_estimate(argv: list[str]) -> tuple[KvEstimateEntry | None, str | None]:
    """`loadgen kv`'s estimate for the cell's flags, or None and why not."""
    from ..analysis.grid_cells import cache_flags

    try:
        flags = cache_flags(argv)  # ValueError: a flag's value that is not a number (--parallel two)
        if flags.model is None:
            return None, "no -m MODEL.gguf in the command"
        facts = read_gguf(flags.model)
        shape = model_shape(facts.metadata)
        est = estimate(shape, flags.n_ctx, flags.n_parallel, unified=flags.unified, type_k=flags.type_k,
                       type_v=flags.type_v, n_ubatch=flags.n_ubatch, n_batch=flags.n_batch,
                       flash_attn=flags.flash_attn, swa_full=flags.swa_full)
    except (UserError, ValueError) as exc:  # ModelShapeError, or a flag's value that is not a number
        return None, str(exc)
    return KvEstimateEntry(kv_mib=round((est.kv_bytes + est.swa_bytes) / MIB, 2), n_ctx=est.n_ctx,
                           n_ctx_seq=est.n_ctx_seq, cells=est.cells, layers=est.layers, n_stream=est.n_stream,
                           recurrent_mib=round(est.recurrent_bytes / MIB, 2),
                           total_mib=round(est.total_bytes / MIB, 2), weights_mib=round(facts.weights_bytes / MIB, 2)), None


def measure(kind: str, url: str, label: str, args: tuple[str, ...], out: Path, folder: Path) -> int:
    """The measurement in its own process (output to files); a signal loadgen gets is passed on."""
    cmd = [sys.executable, "-m", "loadgen.cli", kind, "--url", url, "--label", label, *args, "--output", str(out)]
    with open(folder / f"{kind}.out", "wb") as stdout, open(folder / f"{kind}.err", "wb") as stderr:
        proc = start_tied(cmd, signal.SIGINT, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                          start_new_session=True)

        def pass_on(signum: int) -> None:
            if proc.poll() is None:
                proc.send_signal(signum)

        LATCH.listen(pass_on)
        try:
            return proc.wait()
        finally:
            LATCH.listen(None)


def cell_measure_args(kind: str, argv: list[str], pid: int) -> list[str]:
    """What a cell's measurement is given besides the grid's options: for cache-capacity, the cell's
    server pid (its resident memory per K) and, for the prediction, its --cache-ram when its command
    line sets one (llama-server's MiB), --no-cache-idle-slots when it has it, and --kv-unified when
    its KV cache is unified (-kvu, or no --parallel: llama-server's default; analysis.grid_cells.cache_flags)."""
    from ..analysis.grid_cells import cache_flags, flag_value, has_flag

    if kind != "cache-capacity":
        return []
    cache_ram = flag_value(argv, *CACHE_RAM_FLAGS)
    try:
        unified = cache_flags(argv).unified
    except ValueError:  # a flag's value that is not a number: the server refuses it, the cell fails there
        unified = False
    return ["--server-pid", str(pid), *(["--cache-ram-mib", cache_ram] if cache_ram is not None else []),
            *(["--no-cache-idle-slots"] if has_flag(argv, "--no-cache-idle-slots") else []),
            *(["--kv-unified"] if unified else [])]


def held_line(entry: CacheCapacityEntry) -> str:
    """A cache-capacity run in a line: the warm conversations held beside the prediction."""
    from ..analysis.grid_capacity import held_answer

    answer = held_answer(entry)
    held = answer.text if answer else "n/a"
    predicted = "no prediction" if entry.predicted_capacity is None else f"predicted {entry.predicted_capacity}"
    return f"holds {held} warm conversation(s) of {entry.conversation_tokens} tokens ({predicted})"


class CellRunner:
    """Runs one cell's repeat: server up, facts, measurement, server down; returns its grid entry."""

    def __init__(self, root: Path, grid: GridDocument, err: Console):
        self.root, self.grid, self.err = root, grid, err
        # Without --memory, a Metal build's working set (recommendedMaxWorkingSetSize, the first
        # boot log that states it, a resumed grid's included) is the budget of the cells after it.
        self.working_set_mib = next((b.metal.working_set_mib for c in grid.cells for r in c.runs
                                     if (b := r.boot) is not None and b.metal is not None
                                     and b.metal.working_set_mib is not None), None)

    def budget(self) -> tuple[float | None, str]:
        """(MiB a cell's weights and KV cache must fit in, what that budget is called in its reason)."""
        if self.grid.memory_mib is not None:
            return self.grid.memory_mib, "--memory"
        return self.working_set_mib, "the Metal working set"

    def _learn_working_set(self, entry: GridRun) -> None:
        metal = entry.boot.metal if entry.boot is not None else None
        if self.grid.memory_mib is None and self.working_set_mib is None and metal is not None \
                and metal.working_set_mib is not None:
            self.working_set_mib = metal.working_set_mib
            self.err.print(f"  no --memory: the Metal working set of this boot log, {metal.working_set_mib:,.2f} MiB "
                           f"(recommendedMaxWorkingSetSize), is the budget of the cells after it", highlight=False,
                           soft_wrap=True)

    def run(self, cell: GridCell, repeat: int) -> GridRun:
        from ..analysis.grid_cells import has_flag, placeholders, render

        folder = self.root / "cells" / cell.id / f"r{repeat}"
        picks_port = "port" in placeholders(self.grid.template) or not has_flag(
            render(self.grid.template, cell.params), "--port")
        for attempt in range(1, PORT_TRIES + 1):
            entry, port_taken = self._attempt(cell, repeat, folder)
            if not (port_taken and picks_port) or attempt == PORT_TRIES:
                break
            # a port grid picked itself was taken before its server bound it: another port, not a failed cell
            self.err.print(f"  {entry.reason}; trying another port", highlight=False)
        return entry

    def _attempt(self, cell: GridCell, repeat: int, folder: Path) -> tuple[GridRun, bool]:
        """One try at the cell's repeat: its grid entry, and whether its port was taken by another process."""
        from ..results.writer import add_server_boot, utc_now

        shutil.rmtree(folder, ignore_errors=True)  # an interrupted attempt's, being run again (--resume)
        folder.mkdir(parents=True)
        try:
            argv, url = server_argv(self.grid.template, cell.params, self.grid.port_range)
        except ServerStartError as exc:  # every port of --port-range taken
            return GridRun(repeat=repeat, started_utc=utc_now().isoformat(), status="failed", reason=str(exc)), False
        estimate, note = kv_estimate(argv)
        # status: the attempt sets it before it returns the entry
        entry = GridRun(repeat=repeat, started_utc=utc_now().isoformat(), command=argv, url=url,
                        log=str((folder / "server.log").relative_to(self.root)), kv_estimate=estimate,
                        kv_estimate_note=note, status="started")
        memory_mib, budget_name = self.budget()
        if memory_mib is not None and estimate is None:  # said, not silently started
            self.err.print(f"  --memory not applied to this cell: {note or 'no KV estimate'}", highlight=False)
        if memory_mib is not None and estimate is not None:
            too_big = does_not_fit(estimate.weights_mib, estimate.total_mib, memory_mib, budget_name)
            if too_big:  # feasible first, for free: no boot for a cell that cannot fit
                entry.status, entry.reason, entry.log = INFEASIBLE, too_big, None
                entry.finished_utc = entry.started_utc
                return entry, False
        address = url.removeprefix("http://")
        host, _, port = address.rpartition(":")
        problem = bind_problem(host, int(port))
        if problem:  # never start a server that cannot have its port: something else would answer for it
            entry.status, entry.reason = "failed", bind_failure(address, problem)
            return entry, problem == "in use"
        try:
            server = launch(argv, url, folder / "server.log")
        except ServerStartError as exc:
            entry.status, entry.reason = "failed", str(exc)
            return entry, False
        entry.pid = server.pid
        try:
            self._measure(entry, cell, server, folder, argv, host, int(port))
        finally:
            entry.server_exit = stop(server)
            entry.server_gone = True  # stop() raises otherwise
        entry.finished_utc = utc_now().isoformat()
        log = server.log_path.read_text(errors="replace")
        if entry.status == "ok":  # the run's fingerprint gets what the grid alone saw: flags, boot decisions
            add_server_boot(folder / "run", CELL_LABEL, server_boot(log, argv))
        else:
            entry.log_tail = log_tail(log)
            why = boot_failure(log) if entry.reason and "before it was healthy" in entry.reason else None
            if why:  # the server's own words: "error: invalid argument: --bogus", "failed to allocate ..."
                entry.reason = f"{entry.reason}: {why}"
        return entry, entry.status == "failed" and entry.reason == bind_failure(address)

    def _measure(self, entry: GridRun, cell: GridCell, server: ServerProcess, folder: Path, argv: list[str],
                 host: str, port: int) -> None:
        """Waits for the server, checks it is the cell's, records its facts and runs the measurement:
        sets the entry's status and reason, and what it found."""
        from ..analysis.grid_cells import flag_value

        last = [0.0]

        def on_wait(elapsed: float, state: str) -> None:
            if elapsed - last[0] >= 5:
                last[0] = elapsed
                self.err.print(f"  waiting for the server: {state} ({elapsed:.0f} s)", highlight=False)

        reason = wait_ready(server, self.grid.wait_ready_s, stop_requested=lambda: bool(LATCH.received),
                            on_wait=on_wait)
        props = (get_json(server.url, "/props") or {}) if reason is None else {}
        exit_code = server.proc.poll()
        if reason is None and exit_code is not None:  # it answered, then exited: or someone else answered
            reason = f"the server exited with code {exit_code} before it was healthy"
        if reason is None or exit_code is not None:
            reason = not_the_cells_server(f"{host}:{port}", port_holder(server, host, port), exit_code is None,
                                          ServerProps.of(props).total_slots,
                                          asked_slots(flag_value(argv, "-np", "--parallel"))) or reason
        if reason:
            entry.status, entry.reason = "interrupted" if LATCH.received else "failed", reason
            return
        entry.boot = msgspec.convert(boot_facts(server.log_path.read_text(errors="replace")).to_dict(), BootEntry)
        self._learn_working_set(entry)
        entry.props = {k: props.get(k) for k in PROPS}
        entry.run_dir = str((folder / "run").relative_to(self.root))
        args = (*self.grid.measure_args, *(cell.measure_args or ()), *cell_measure_args(self.grid.measure, argv, server.pid))
        code = measure(self.grid.measure, server.url, CELL_LABEL, args, folder / "run", folder)
        entry.measure_exit = code
        died = server.proc.poll()
        if LATCH.received:
            entry.status, entry.reason = "interrupted", "interrupted during the measurement"
        elif died is not None:
            entry.status, entry.reason = "failed", f"{ended('the server', died)} during the measurement"
        elif code != 0:
            tail = log_tail((folder / f"{self.grid.measure}.err").read_text(errors="replace"), 1)
            entry.status = "failed"
            entry.reason = f"{ended(self.grid.measure, code)}: {tail[0] if tail else '(no message)'}"
        else:
            self._read_result(entry, folder / "run")

    def _read_result(self, entry: GridRun, run_dir: Path) -> None:
        """A finished measurement: its answer kept in the entry (capacity, cache-capacity), status ok,
        or failed when the file with it is missing or damaged."""
        from ..results.grid_file import read_cache_capacity, read_capacity

        try:
            if self.grid.measure == "capacity":
                entry.capacity = read_capacity(run_dir)
            elif self.grid.measure == "cache-capacity":
                entry.cache_capacity = read_cache_capacity(run_dir)
            entry.status = "ok"
        except ResultsError as exc:
            entry.status, entry.reason = "failed", str(exc)


def run_grid(root: Path, grid: GridDocument, err: Console, keep_going: Callable[[], bool] | None = None,
             before_run: Callable[[GridCell], None] | None = None) -> int:
    """Every (repeat, cell) not done yet, in interleaved order; grid.json after each. `keep_going`, asked
    before each run, stops the grid when it says no (tune's --budget): the rest stay not run.
    `before_run(cell)` may set the cell's own measurement options from the runs before it (tune's bar)."""
    from ..analysis.grid_cells import run_order
    from ..results.grid_file import DONE, write_grid

    runner = CellRunner(root, grid, err)
    for note in fallback_notes():
        err.print(f"grid: {note}", highlight=False)
    cells, failed = grid.cells, False
    todo = [(r, c) for r, c in run_order(len(cells), grid.repeat)
            if not any(e.repeat == r and e.status in DONE for e in cells[c].runs)]
    for n, (repeat, index) in enumerate(todo, 1):
        if LATCH.received or (keep_going is not None and not keep_going()):
            break
        cell = cells[index]
        if before_run is not None:
            before_run(cell)
        err.print(f"grid {n}/{len(todo)}: {cell.id} {cell.name} (run {repeat}/{grid.repeat})", highlight=False)
        entry = runner.run(cell, repeat)
        cell.runs = [e for e in cell.runs if e.repeat != repeat] + [entry]
        write_grid(root, grid)
        if entry.status == "ok":
            line = (entry.capacity.verdict if entry.capacity else held_line(entry.cache_capacity)
                    if entry.cache_capacity else cell_run_line(root / str(entry.run_dir)))
            err.print(f"  ok: {line}", highlight=False)
        else:
            failed = failed or entry.status == "failed"
            err.print(f"  {entry.status}: {entry.reason}", style="yellow", highlight=False)
            for line in entry.log_tail[-3:]:
                err.print(f"    {line}", highlight=False, markup=False)
    failed = failed or any(e.status == "failed" for c in cells for e in c.runs)
    return LATCH.exit_code or (EXIT_FAILED if failed else EXIT_OK)


def cell_run_line(run_dir: Path) -> str:
    """A finished cell run's figures in one line (`analysis.grid_cells.run_line`)."""
    from ..analysis.grid_cells import run_line

    try:
        return run_line(load_run(run_dir))
    except ResultsError as exc:
        return str(exc)


def as_flags(option: click.Option, value: Any) -> list[str]:
    """A scenario key's value as the measurement's command line has it (the key was checked already)."""
    name = max(option.opts, key=len)
    if option.is_flag:
        if value:
            return [name]
        return [max(option.secondary_opts, key=len)] if option.secondary_opts else []
    if option.multiple:
        return [arg for item in (value if isinstance(value, list) else [value]) for arg in (name, str(item))]
    return [name, ",".join(map(str, value)) if isinstance(value, list) else str(value)]


def scenario_kwargs(command: click.Command, commands: dict[str, click.Command], settings: dict[str, Any],
                    ctx: click.Context, measure: str | None = None) -> dict[str, Any]:
    """`mode = "grid"` (or "tune") in a scenario file: the command's own keys (server, param, repeat,
    measure, ...) go to it, every other key to its measurement (grid's `measure`, or `measure` given:
    tune's capacity), each checked by the option that reads it."""
    from .scenario import ScenarioError, keys_of, resolve, suggestion

    own = keys_of(command)
    kwargs = resolve(command, {k: s for k, s in settings.items() if k in own}, ctx)
    kind = measure or kwargs.get("kind") or "sweep"
    rest = {k: s for k, s in settings.items() if k not in own}
    root = ctx.find_root().command
    # a measurement that is no scenario mode of its own (capacity) is still a loadgen command
    measurement = commands.get(kind) or (root.get_command(ctx, kind) if isinstance(root, click.Group) else None)
    assert measurement is not None, f"--measure {kind} is not a loadgen command"
    theirs = keys_of(measurement)
    unknown = next((s for k, s in rest.items() if k not in theirs), None)
    if unknown is not None:  # named for the grid: its keys and its measurement's are both allowed
        raise ScenarioError(f"{unknown.where}: {unknown.key}: unknown key for mode '{command.name}' (its own keys "
                            f"and its measurement's, {kind})" + suggestion(unknown.key, {**own, **theirs}))
    resolve(measurement, rest, ctx)
    options = theirs
    kwargs["measure_args"] = tuple(arg for key, s in rest.items() for arg in as_flags(options[key], s.value))
    return kwargs


def check_measure_args(kind: str, args: tuple[str, ...]) -> None:
    """The measurement's own rules, applied now (as `loadgen run --check` does), not at the first cell."""
    clash = next((a for a in args if a.split("=")[0] in RESERVED), None)
    if clash:
        raise ConfigError(f"{clash.split('=')[0]} is set by grid itself for every cell")
    clash = next((a for a in args if a.split("=")[0] in CELL_SET), None) if kind == "cache-capacity" else None
    if clash:
        raise ConfigError(f"{clash.split('=')[0]} is set by grid for every cell (the cell's server pid, and its "
                          "--cache-ram and cache modes from its command line)")
    if kind == "capacity" and not any(a.split("=")[0] == "--slo" for a in args):
        raise ConfigError("--measure capacity needs --slo: the latency targets each cell's capacity is measured "
                          "within (e.g. --slo ttft=500ms,tpot=50ms)")
    from .main import cli

    command = cli.get_command(None, kind)
    if command is None:
        raise ConfigError(f"--measure {kind}: not a loadgen command")
    try:
        with command.make_context(kind, [*args, "--url", "http://127.0.0.1:9"]) as ctx:
            ctx.meta[CHECK_ONLY] = True
            command.invoke(ctx)
    except click.ClickException as exc:
        raise ConfigError(f"{kind} options: {exc.format_message()}") from None


def new_grid(template: str, param_texts: tuple[str, ...], repeat: int, kind: Measure, args: tuple[str, ...],
             wait_ready_s: float, port_range: tuple[int, int] | None = None,
             memory_mib: float | None = None) -> GridDocument:
    from ..analysis.grid_cells import cell_names, check_template, cross, parse_param, render
    from ..results.writer import command_line

    params: list[GridParam] = [parse_param(p) for p in param_texts]
    check_template(template, params)
    render(template, {p.name: p.values[0] for p in params})
    combos = cross(params)
    cells = [GridCell(id=f"c{i:02d}", name=name, params=values, runs=[])
             for i, (values, name) in enumerate(zip(combos, cell_names(combos)), 1)]
    return GridDocument(command=command_line(), template=template,
                        params=[GridParamEntry(p.name, list(p.values)) for p in params], repeat=repeat,
                        measure=kind, measure_args=list(args), wait_ready_s=wait_ready_s, cells=cells,
                        port_range=port_range, memory_mib=memory_mib)


@command("grid", context_settings={"ignore_unknown_options": True})
@click.option("--server", "template", help="The server's command line with {name} placeholders, e.g. "
                                          "'llama-server -m {model} --parallel {parallel} -c 8192 --metrics'.")
@click.option("--param", "param_texts", multiple=True, metavar="NAME=V1,V2",
              help="A placeholder's values (repeatable); the cells are every combination.")
@click.option("--repeat", type=click.IntRange(1, 100), default=1, show_default=True,
              help="Runs per cell, interleaved (A B C, A B C, ...); the table shows mean ± sd.")
@click.option("--measure", "kind", type=click.Choice(MEASURES), default="sweep", show_default=True,
              help="What runs against each cell's server (its options go after the grid's); capacity needs "
                   "--slo.")
@click.option("--wait-ready", "wait_ready_s", type=click.FloatRange(min=0), default=600, show_default=True,
              help="Seconds a server may take to load its model before its cell counts as failed.")
@click.option("--port-range", callback=lambda ctx, param, value: parse_port_range(value), metavar="FIRST-LAST",
              help="Ports a cell's server may listen on (where {port} goes, or its --port); default: any "
                   "free port.")
@click.option("--memory", "memory_text", metavar="SIZE",
              help="Memory for weights and caches (24GiB): a llama-server cell whose model weights and KV cache "
                   "alone exceed it is not started, and is recorded as infeasible. Not given: on a Metal build "
                   "(a Mac), the working set its first boot log states (recommendedMaxWorkingSetSize).")
@click.option("--output", type=click.Path(file_okay=False), help="Grid folder [default: results/<UTC time>-grid].")
@click.option("--force", is_flag=True, help="Overwrite a folder that already holds results.")
@click.option("--resume", type=click.Path(file_okay=False), help="Continue an interrupted grid in this folder.")
@click.argument("measure_args", nargs=-1, type=click.UNPROCESSED, metavar="[MEASUREMENT OPTIONS]")
def grid_command(template, param_texts, repeat, kind, wait_ready_s, port_range, output, force, resume,
                 measure_args, memory_text=None) -> None:
    """Start a server per combination of --param values, measure each, and compare the cells in one table.

    Any other option goes to the measurement (e.g. --concurrency 1,2,4 --n-predict 32).
    """
    from ..analysis.grid_cells import render
    from ..output.grid_table import print_grid
    from ..results.grid_file import grid_summaries, is_grid, load_grid, write_grid

    with user_errors():
        if resume:
            root = Path(resume)
            grid = load_grid(root)
            given = [*(["--server"] if template else []), *(["--param"] if param_texts else []),
                     *(flag for name, flag in (("repeat", "--repeat"), ("kind", "--measure"),
                                               ("wait_ready_s", "--wait-ready"), ("port_range", "--port-range"),
                                               ("memory_text", "--memory"))
                       if click.get_current_context().get_parameter_source(name) is not ParameterSource.DEFAULT),
                     *measure_args]
            if given:
                raise ConfigError("--resume continues a grid as it was given; leave out " + " ".join(given))
            for cell in grid.cells:  # every cell's command line, before any server starts
                render(grid.template, cell.params)
        else:
            if not template:
                raise ConfigError("give --server 'COMMAND with {placeholders}' (or --resume DIR)")
            memory_mib = parse_size(memory_text) / MIB if memory_text is not None else None
            grid = new_grid(template, param_texts, repeat, kind, measure_args, wait_ready_s, port_range, memory_mib)
    # outside user_errors: a ConfigError here is a rule across the measurement's keys, which
    # `loadgen run` prefixes with the scenario file, as it does a sweep's
    check_measure_args(grid.measure, tuple(grid.measure_args))
    if checking_only():
        return
    with user_errors():
        if not resume:
            root = results_folder(output, force, "grid")
            if is_grid(root) and not force:
                raise ConfigError(f"{root} already holds a grid; continue it with --resume {root} or add --force")
            shutil.rmtree(root / "cells", ignore_errors=True)  # --force: the earlier grid's cells, nothing else
            write_grid(root, grid)
    err = _console(stderr=True)
    LATCH.install()
    started = time.monotonic()
    code = run_grid(root, grid, err)
    print_grid(_console(), grid, grid_summaries(root, grid))
    err.print(f"grid: {root} ({time.monotonic() - started:.0f} s)", highlight=False)
    if LATCH.received:
        err.print(f"grid: interrupted; continue with loadgen grid --resume {root}", highlight=False)
    sys.exit(code)
