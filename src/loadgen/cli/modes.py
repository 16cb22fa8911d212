"""What the run kinds of one table per target (`prefill`, `depth`, `soak`: kinds/) share: their
base config, output folder, level runner, and running and finishing the run.

The measuring is in run/steps.py (prefill, depth) and run/soak.py, the figures in the pure summary
functions of analysis/prefill.py, depth.py and soak.py, the tables in output/tables.py.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from ..core.errors import EXIT_FAILED, EXIT_OK
from ..core.rundoc import RunDocument
from .shared import (
    console,
)

if TYPE_CHECKING:
    from ..core.settings import RequestSettings
    from ..run.config import MachineOptions, SweepConfig
    from ..run.level_runner import LevelRunner
    from ..run.session import Execution
    from ..run.state import Run, RunObserver


def base_config(*, ports: tuple[int, ...] | None, host: str, urls: tuple[str, ...], labels: tuple[str, ...],
                server_urls: tuple[str, ...] = (),
                api: str, model: str | None, api_key: str | None, transport: str, insecure: bool,
                request: RequestSettings, warmup: int, n_predict: int, ignore_eos: bool = True,
                stream: bool = False, concurrency: int = 1, probe_interval_s: float = 0.25,
                machine: MachineOptions | None = None) -> SweepConfig:
    """Targets, API and request settings as a sweep would hold them (one level); `machine`: what
    the run reads of the machine under it (None: the defaults)."""
    from ..client.backends import GenerationParams
    from ..run.config import DEFAULT_PROMPT, MachineOptions, SweepConfig, build_targets, check_api

    return SweepConfig(
        targets=build_targets(host, ports, urls, labels, server_urls), concurrency=(concurrency,),
        generation=GenerationParams(prompt=DEFAULT_PROMPT, n_predict=n_predict, ignore_eos=ignore_eos,
                                    stream=stream, **request.generation()),
        api=check_api(api, model, api_key), model=model, api_key=api_key, warmup=warmup,
        probe_interval_s=probe_interval_s, transport=transport, insecure=insecure,
        machine=machine or MachineOptions(), **request.config())


def finish_mode(execution: Execution, out_dir: Path, err: Console) -> int:
    from ..output.kind_view import view_of
    from ..output.tables import print_run, say

    doc = execution.doc
    print_run(doc, console(), err, live=True)
    typed = RunDocument.of(doc)
    answer = view_of(typed).answer  # the kind's answer line, as `analyze` says it after the table
    line = answer(out_dir, typed) if answer is not None else None
    if line is not None:
        say(console(), line)
    err.print(f"results: {out_dir}", highlight=False)
    if execution.exit_code_for_signal is not None:
        return execution.exit_code_for_signal
    if any(t.error for t in typed.targets):
        return EXIT_FAILED
    if not any(t.levels or any(r.requests_ok for r in getattr(t.section(typed.kind), "rows", []))
               for t in typed.targets):
        err.print("nothing was measured: every step was skipped", style="red", highlight=False)
        return EXIT_FAILED
    return EXIT_OK


def run_mode(run: Run, out_dir: Path, main: Callable, err: Console, records_kept: str = "all",
             records_format: str = "jsonl", checkpoint_every_s: float | None = None) -> None:
    """Execute `run` into `out_dir`, checkpointing every `checkpoint_every_s` seconds (None: run.session's
    SUMMARY_EVERY_S), and exit with the mode's code."""
    from ..results.writer import RunFiles
    from ..run.session import SUMMARY_EVERY_S, FinalWriteError, execute
    from ..run.workers.policy import remove_worker_files

    try:
        execution = execute(run, RunFiles(out_dir, records_kept, records_format), main, err=err,
                            checkpoint_every_s=SUMMARY_EVERY_S if checkpoint_every_s is None else checkpoint_every_s)
    except FinalWriteError as exc:
        err.print(f"loadgen: error: {exc}", style="red", highlight=False, markup=False)
        sys.exit(EXIT_FAILED)
    remove_worker_files(out_dir)
    sys.exit(finish_mode(execution, out_dir, err))


def mode_level_runner(run: Run, out_dir: Path, obs: RunObserver) -> AbstractAsyncContextManager[LevelRunner]:
    """What sends the levels: this process, or the --workers (soak); their histograms into RESULTS."""
    from ..output.worker_hlog import write_worker_hlog
    from ..run.workers.policy import open_level_runner

    return open_level_runner(run.config, out_dir, obs, functools.partial(write_worker_hlog, out_dir))


def mode_out_dir(output: str | None, force: bool, kind: str) -> Path:
    from ..results.writer import default_dir, prepare_dir

    return prepare_dir(Path(output) if output else default_dir(Path("results"), kind), force)


