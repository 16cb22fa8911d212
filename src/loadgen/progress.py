"""What the user sees while a sweep runs: a progress bar per level and a line when each finishes."""

from __future__ import annotations

import statistics
from collections.abc import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from .metrics import latency_ms, throughput_tok_s
from .records import CANCELLED, LevelRun, RequestRecord


class ProgressObserver:
    def __init__(self, console: Console, on_level_done: Callable[[], None] | None = None):
        self.console = console
        self._on_level_done = on_level_done
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TextColumn("{task.fields[failed]}"), TimeElapsedColumn(),
                                 console=console, transient=True, refresh_per_second=4,
                                 disable=not console.is_terminal)
        self._tasks: dict[tuple[str, int], int] = {}
        self._failed: dict[tuple[str, int], int] = {}

    def __enter__(self) -> "ProgressObserver":
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def message(self, text: str) -> None:
        self.progress.console.print(text, highlight=False, markup=False)

    def level_started(self, target: str, concurrency: int, requests: int | None, duration_s: float | None) -> None:
        what = f"{target} c={concurrency}" + (f" {duration_s:g}s" if duration_s is not None else "")
        key = (target, concurrency)
        self._failed[key] = 0
        self._tasks[key] = self.progress.add_task(what, total=requests, failed="")

    def request_done(self, record: RequestRecord) -> None:
        key = (record.target, record.level)
        task = self._tasks.get(key)
        if task is None:
            return
        if not record.ok:
            self._failed[key] += 1
            self.progress.update(task, advance=1, failed=f"[red]{self._failed[key]} failed")
        else:
            self.progress.advance(task)

    def level_done(self, run: object, target: object, level: LevelRun) -> None:
        task = self._tasks.pop((level.target, level.concurrency), None)
        if task is not None:
            self.progress.remove_task(task)
        ok = [r for r in level.records if r.ok]
        failed = sum(1 for r in level.records if not r.ok and r.error_kind != CANCELLED)
        lat = f", latency p50 {statistics.median(latency_ms(r) for r in ok):,.0f} ms" if ok else ""
        tail = f"  ({level.stopped_reason})" if level.stopped_reason else ""
        self.message(f"{level.target} c={level.concurrency}: {len(ok)} ok, {failed} failed, "
                     f"{throughput_tok_s(level.records):,.2f} tok/s{lat}{tail}")
        if self._on_level_done is not None:
            self._on_level_done()
