"""`loadgen grid`: start a server per configuration, measure it, stop it; then one table of the cells.

Each cell's server is started by loadgen on a free loopback port (`run.servers`: its own process
group, killed with loadgen however loadgen ends), with `--host`, `--port` and `-lv 4` added unless
the template sets them (`-lv 4` prints the KV cache lines of the boot log; it also logs about 28
lines per request instead of 7, to a file). A cell measures only its own server: its port must be
free before the server starts, and once /health answers, every socket listening on that port must be
the server's (`core.ports`; /props' slot count where the system cannot tell); otherwise the cell
fails with "could not bind HOST:PORT (in use)" (a port grid picked itself is tried again with another). The measurement is a fresh `loadgen sweep` (or prefill,
depth) process against it, as `loadgen ab` runs its sweeps, so every cell's folder is a run in
today's format. Before the next cell starts, the server is stopped and its pid checked gone.

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
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from ..analysis.bootlog import boot_facts, log_tail
from ..analysis.grid_cells import (
    GridParam,
    cache_flags,
    cell_name,
    check_template,
    cross,
    flag_value,
    has_flag,
    parse_param,
    render,
    run_order,
)
from ..analysis.kv import MIB, estimate, model_shape
from ..analysis.server_ownership import asked_slots, bind_failure, not_the_cells_server
from ..core.errors import EXIT_FAILED, EXIT_OK, ConfigError, UserError
from ..core.ports import bind_problem
from ..core.signals import LATCH
from ..output.grid_table import print_grid
from ..results.grid_file import DONE, grid_summaries, is_grid, load_grid, write_grid
from ..results.writer import command_line, default_dir, prepare_dir, utc_now
from ..run.gguf_file import read_gguf
from ..run.servers import ServerProcess, ServerStartError, free_port, get_json, launch, port_holder, stop, wait_ready
from .ab import run_summary
from .common import die_with_parent, user_errors
from .help import command
from .shared import CHECK_ONLY, checking_only
from .shared import console as _console

MEASURES = ("sweep", "prefill", "depth")
RESERVED = ("--url", "--ports", "--host", "--label", "--output", "--force")
PORT_TRIES = 3  # ports grid picks itself for one cell before it counts as failed
VERBOSITY_FLAGS = ("-lv", "--verbosity", "--log-verbosity", "-v", "--verbose", "--log-verbose")


def server_argv(template: str, values: dict[str, str]) -> tuple[list[str], str]:
    """The cell's argv with loadgen's additions (a free loopback port, -lv 4), and its URL."""
    argv = render(template, values)
    if not argv:
        raise ConfigError("--server is empty; give the server's command line, e.g. 'llama-server -m {model}'")
    port = flag_value(argv, "--port")
    if port is None:
        port = str(free_port())
        argv += ["--port", port]
    host = flag_value(argv, "--host")
    if host is None:
        host = "127.0.0.1"
        argv += ["--host", host]
    if not has_flag(argv, *VERBOSITY_FLAGS):
        argv += ["-lv", "4"]  # the boot log's KV cache lines need it
    return argv, f"http://{host}:{port}"


def kv_estimate(argv: list[str]) -> tuple[dict[str, Any] | None, str | None]:
    """`loadgen kv`'s estimate for the cell's flags, or None and why not."""
    flags = cache_flags(argv)
    if flags.model is None:
        return None, "no -m MODEL.gguf in the command"
    try:
        shape = model_shape(read_gguf(flags.model).metadata)
        est = estimate(shape, flags.n_ctx, flags.n_parallel, unified=flags.unified, type_k=flags.type_k,
                       type_v=flags.type_v, n_ubatch=flags.n_ubatch, n_batch=flags.n_batch,
                       flash_attn=flags.flash_attn, swa_full=flags.swa_full)
    except (UserError, ValueError) as exc:  # ModelShapeError, or a flag's value that is not a number
        return None, str(exc)
    return {"kv_mib": round((est.kv_bytes + est.swa_bytes) / MIB, 2), "n_ctx": est.n_ctx, "n_ctx_seq": est.n_ctx_seq,
            "cells": est.cells, "layers": est.layers, "n_stream": est.n_stream,
            "recurrent_mib": round(est.recurrent_bytes / MIB, 2), "total_mib": round(est.total_bytes / MIB, 2)}, None


def measure(kind: str, url: str, label: str, args: tuple[str, ...], out: Path, folder: Path) -> int:
    """The measurement in its own process (output to files); a signal loadgen gets is passed on."""
    cmd = [sys.executable, "-m", "loadgen.cli", kind, "--url", url, "--label", label, *args, "--output", str(out)]
    with open(folder / f"{kind}.out", "wb") as stdout, open(folder / f"{kind}.err", "wb") as stderr:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, start_new_session=True,
                                preexec_fn=die_with_parent(signal.SIGINT))
        LATCH.listen(lambda signum: proc.poll() is None and proc.send_signal(signum))
        try:
            return proc.wait()
        finally:
            LATCH.listen(None)


class CellRunner:
    """Runs one cell's repeat: server up, facts, measurement, server down; returns its grid entry."""

    def __init__(self, root: Path, doc: dict[str, Any], err: Console):
        self.root, self.doc, self.err = root, doc, err

    def run(self, cell: dict[str, Any], repeat: int) -> dict[str, Any]:
        folder = self.root / "cells" / cell["id"] / f"r{repeat}"
        picks_port = not has_flag(render(self.doc["template"], cell["params"]), "--port")
        for attempt in range(1, PORT_TRIES + 1):
            entry, port_taken = self._attempt(cell, repeat, folder)
            if not (port_taken and picks_port) or attempt == PORT_TRIES:
                break
            # a port grid picked itself was taken before its server bound it: another port, not a failed cell
            self.err.print(f"  {entry['reason']}; trying another port", highlight=False)
        return entry

    def _attempt(self, cell: dict[str, Any], repeat: int, folder: Path) -> tuple[dict[str, Any], bool]:
        """One try at the cell's repeat: its grid entry, and whether its port was taken by another process."""
        shutil.rmtree(folder, ignore_errors=True)  # an interrupted attempt's, being run again (--resume)
        folder.mkdir(parents=True)
        argv, url = server_argv(self.doc["template"], cell["params"])
        entry: dict[str, Any] = {"repeat": repeat, "started_utc": utc_now().isoformat(), "command": argv, "url": url,
                                 "log": str((folder / "server.log").relative_to(self.root))}
        entry["kv_estimate"], entry["kv_estimate_note"] = kv_estimate(argv)
        address = url.removeprefix("http://")
        host, _, port = address.rpartition(":")
        problem = bind_problem(host, int(port))
        if problem:  # never start a server that cannot have its port: something else would answer for it
            return {**entry, "status": "failed", "reason": bind_failure(address, problem), "log_tail": []}, \
                problem == "in use"
        try:
            server = launch(argv, url, folder / "server.log")
        except ServerStartError as exc:
            return {**entry, "status": "failed", "reason": str(exc), "log_tail": []}, False
        entry["pid"] = server.pid
        try:
            entry.update(self._measure(cell, server, folder, argv, host, int(port)))
        finally:
            entry["server_exit"] = stop(server)
            entry["server_gone"] = True  # stop() raises otherwise
        entry["finished_utc"] = utc_now().isoformat()
        if entry["status"] != "ok":
            entry["log_tail"] = log_tail(server.log_path.read_text(errors="replace"))
        return entry, entry["status"] == "failed" and entry["reason"] == bind_failure(address)

    def _measure(self, cell: dict[str, Any], server: ServerProcess, folder: Path, argv: list[str], host: str,
                 port: int) -> dict[str, Any]:
        last = [0.0]

        def on_wait(elapsed: float, state: str) -> None:
            if elapsed - last[0] >= 5:
                last[0] = elapsed
                self.err.print(f"  waiting for the server: {state} ({elapsed:.0f} s)", highlight=False)

        reason = wait_ready(server, self.doc["wait_ready_s"], stop_requested=lambda: bool(LATCH.received),
                            on_wait=on_wait)
        props = (get_json(server.url, "/props") or {}) if reason is None else {}
        exit_code = server.proc.poll()
        if reason is None and exit_code is not None:  # it answered, then exited: or someone else answered
            reason = f"the server exited with code {exit_code} before it was healthy"
        if reason is None or exit_code is not None:
            reason = not_the_cells_server(f"{host}:{port}", port_holder(server, host, port), exit_code is None,
                                          props.get("total_slots"),
                                          asked_slots(flag_value(argv, "-np", "--parallel"))) or reason
        if reason:
            return {"status": "interrupted" if LATCH.received else "failed", "reason": reason}
        facts = boot_facts(server.log_path.read_text(errors="replace"))
        found = {"boot": facts.to_dict(), "props": {k: props.get(k) for k in ("total_slots", "model_alias",
                                                                                "model_path", "build_info")},
                 "run_dir": str((folder / "run").relative_to(self.root))}
        code = measure(self.doc["measure"], server.url, cell["name"], tuple(self.doc["measure_args"]),
                       folder / "run", folder)
        found["measure_exit"] = code
        died = server.proc.poll()
        if LATCH.received:
            return {**found, "status": "interrupted", "reason": "interrupted during the measurement"}
        if died is not None:
            return {**found, "status": "failed", "reason": f"the server exited with code {died} during the measurement"}
        if code != 0:
            tail = log_tail((folder / f"{self.doc['measure']}.err").read_text(errors="replace"), 1)
            return {**found, "status": "failed",
                    "reason": f"{self.doc['measure']} exited with {code}: {tail[0] if tail else '(no message)'}"}
        return {**found, "status": "ok"}


def run_grid(root: Path, doc: dict[str, Any], err: Console) -> int:
    """Every (repeat, cell) not done yet, in interleaved order; grid.json after each."""
    runner = CellRunner(root, doc, err)
    cells, failed = doc["cells"], False
    todo = [(r, c) for r, c in run_order(len(cells), doc["repeat"])
            if not any(e["repeat"] == r and e["status"] in DONE for e in cells[c]["runs"])]
    for n, (repeat, index) in enumerate(todo, 1):
        if LATCH.received:
            break
        cell = cells[index]
        err.print(f"grid {n}/{len(todo)}: {cell['id']} {cell['name']} (run {repeat}/{doc['repeat']})", highlight=False)
        entry = runner.run(cell, repeat)
        cell["runs"] = [e for e in cell["runs"] if e["repeat"] != repeat] + [entry]
        write_grid(root, doc)
        if entry["status"] == "ok":
            err.print(f"  ok: {run_summary(root / entry['run_dir'])}", highlight=False)
        else:
            failed = failed or entry["status"] == "failed"
            err.print(f"  {entry['status']}: {entry['reason']}", style="yellow", highlight=False)
            for line in entry.get("log_tail", [])[-3:]:
                err.print(f"    {line}", highlight=False, markup=False)
    failed = failed or any(e["status"] == "failed" for c in cells for e in c["runs"])
    return LATCH.exit_code or (EXIT_FAILED if failed else EXIT_OK)


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
                    ctx: click.Context) -> dict[str, Any]:
    """`mode = "grid"` in a scenario file: the grid's own keys (server, param, repeat, measure, ...) go
    to the grid, every other key to its measurement, each checked by the option that reads it."""
    from .scenario import keys_of, resolve

    own = keys_of(command)
    kwargs = resolve(command, {k: s for k, s in settings.items() if k in own}, ctx)
    kind = kwargs.get("kind") or "sweep"
    rest = {k: s for k, s in settings.items() if k not in own}
    resolve(commands[kind], rest, ctx)
    options = keys_of(commands[kind])
    kwargs["measure_args"] = tuple(arg for key, s in rest.items() for arg in as_flags(options[key], s.value))
    return kwargs


def check_measure_args(kind: str, args: tuple[str, ...]) -> None:
    """The measurement's own rules, applied now (as `loadgen run --check` does), not at the first cell."""
    clash = next((a for a in args if a.split("=")[0] in RESERVED), None)
    if clash:
        raise ConfigError(f"{clash.split('=')[0]} is set by grid itself for every cell")
    from .main import cli

    command = cli.get_command(None, kind)
    try:
        with command.make_context(kind, [*args, "--url", "http://127.0.0.1:9"]) as ctx:
            ctx.meta[CHECK_ONLY] = True
            command.invoke(ctx)
    except click.ClickException as exc:
        raise ConfigError(f"{kind} options: {exc.format_message()}") from None


def new_grid(template: str, param_texts: tuple[str, ...], repeat: int, kind: str, args: tuple[str, ...],
             wait_ready_s: float) -> dict[str, Any]:
    params: list[GridParam] = [parse_param(p) for p in param_texts]
    check_template(template, params)
    render(template, {p.name: p.values[0] for p in params})
    cells = [{"id": f"c{i:02d}", "name": cell_name(values), "params": values, "runs": []}
             for i, values in enumerate(cross(params), 1)]
    return {"command": command_line(), "template": template,
            "params": [{"name": p.name, "values": list(p.values)} for p in params], "repeat": repeat,
            "measure": kind, "measure_args": list(args), "wait_ready_s": wait_ready_s, "cells": cells}


@command("grid", context_settings={"ignore_unknown_options": True})
@click.option("--server", "template", help="The server's command line with {name} placeholders, e.g. "
                                          "'llama-server -m {model} --parallel {parallel} -c 8192 --metrics'.")
@click.option("--param", "param_texts", multiple=True, metavar="NAME=V1,V2",
              help="A placeholder's values (repeatable); the cells are every combination.")
@click.option("--repeat", type=click.IntRange(1, 100), default=1, show_default=True,
              help="Runs per cell, interleaved (A B C, A B C, ...); the table shows mean ± sd.")
@click.option("--measure", "kind", type=click.Choice(MEASURES), default="sweep", show_default=True,
              help="What runs against each cell's server (its options go after the grid's).")
@click.option("--wait-ready", "wait_ready_s", type=click.FloatRange(min=0), default=600, show_default=True,
              help="Seconds a server may take to load its model before its cell counts as failed.")
@click.option("--output", type=click.Path(file_okay=False), help="Grid folder [default: results/<UTC time>-grid].")
@click.option("--force", is_flag=True, help="Overwrite a folder that already holds results.")
@click.option("--resume", type=click.Path(file_okay=False), help="Continue an interrupted grid in this folder.")
@click.argument("measure_args", nargs=-1, type=click.UNPROCESSED, metavar="[MEASUREMENT OPTIONS]")
def grid_command(template, param_texts, repeat, kind, wait_ready_s, output, force, resume, measure_args) -> None:
    """Start a server per combination of --param values, measure each, and compare the cells in one table.

    Any other option goes to the measurement (e.g. --concurrency 1,2,4 --n-predict 32).
    """
    with user_errors():
        if resume:
            root = Path(resume)
            doc = load_grid(root)
            if template or param_texts:
                raise ConfigError("--resume continues a grid as it was given; leave out --server and --param")
            for cell in doc["cells"]:  # every cell's command line, before any server starts
                render(doc["template"], cell["params"])
        else:
            if not template:
                raise ConfigError("give --server 'COMMAND with {placeholders}' (or --resume DIR)")
            doc = new_grid(template, param_texts, repeat, kind, measure_args, wait_ready_s)
        check_measure_args(doc["measure"], tuple(doc["measure_args"]))
        if checking_only():
            return
        if not resume:
            root = prepare_dir(Path(output) if output else default_dir(Path("results"), "grid"), force)
            if is_grid(root) and not force:
                raise ConfigError(f"{root} already holds a grid; continue it with --resume {root} or add --force")
            shutil.rmtree(root / "cells", ignore_errors=True)  # --force: the earlier grid's cells, nothing else
            write_grid(root, doc)
    err = _console(stderr=True)
    LATCH.install()
    started = time.monotonic()
    code = run_grid(root, doc, err)
    print_grid(_console(), doc, grid_summaries(root, doc))
    err.print(f"grid: {root} ({time.monotonic() - started:.0f} s)", highlight=False)
    if LATCH.received:
        err.print(f"grid: interrupted; continue with loadgen grid --resume {root}", highlight=False)
    sys.exit(code)
