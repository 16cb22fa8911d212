"""What the user sees while a sweep runs: a progress bar per level and a line when each finishes."""

from __future__ import annotations

from collections.abc import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from .metrics import summarize_level
from .records import LevelRun, RequestRecord


class ProgressObserver:
    def __init__(self, console: Console, on_level_done: Callable[[], None] | None = None):
        self.console = console
        self._on_level_done = on_level_done
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TextColumn("{task.fields[failed]}"), TimeElapsedColumn(),
                                 console=console, transient=True)
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
        s = summarize_level(level.concurrency, level.records, level.stopped_reason)
        lat = f", latency p50 {s.latency_ms.p50:,.0f} ms" if s.latency_ms else ""
        tail = f"  ({level.stopped_reason})" if level.stopped_reason else ""
        self.message(f"{level.target} c={level.concurrency}: {s.requests_ok} ok, {s.requests_failed} failed, "
                     f"{s.throughput_tok_s:,.2f} tok/s{lat}{tail}")
        if self._on_level_done is not None:
            self._on_level_done()
