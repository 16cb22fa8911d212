"""What the user sees while a sweep runs: a progress bar per level and a line when each finishes."""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from .metrics import latency_ms, throughput_tok_s
from .records import CANCELLED, LevelRun, RequestRecord


class ProgressObserver:
    FLUSH_S = 0.25

    def __init__(self, console: Console, on_level_done: Callable[[], None] | None = None):
        self.console = console
        self._on_level_done = on_level_done
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TextColumn("{task.fields[failed]}"), TimeElapsedColumn(),
                                 console=console, transient=True, auto_refresh=False,
                                 disable=not console.is_terminal)
        self._ticker: asyncio.TimerHandle | None = None
        self._tasks: dict[tuple[str, int], int] = {}
        # Completions are counted here and handed to Rich every FLUSH_S by a timer on the event loop.
        # A Rich update per request, or Rich's own refresh thread (which makes the loop's thread
        # fight for the GIL), cost more than the engine's whole bookkeeping at thousands of req/s.
        self._done: dict[tuple[str, int | float], list[int]] = {}  # key -> [completed, failed, flushed]

    def __enter__(self) -> "ProgressObserver":
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        self.progress.stop()

    def message(self, text: str) -> None:
        self.progress.console.print(text, highlight=False, markup=False)

    def level_started(self, level: LevelRun, requests: int | None, duration_s: float | None) -> None:
        what = f"{level.target} {_short(level)}" + (f" {duration_s:g}s" if duration_s is not None else "")
        key = (level.target, level.level)
        self._done[key] = [0, 0, 0]
        self._tasks[key] = self.progress.add_task(what, total=requests, failed="")
        if self._ticker is None and not self.progress.disable:
            self._ticker = asyncio.get_running_loop().call_later(self.FLUSH_S, self._tick)

    def request_done(self, record: RequestRecord) -> None:
        counts = self._done.get((record.target, record.level))
        if counts is not None:
            counts[0] += 1
            if not record.ok:
                counts[1] += 1

    def _tick(self) -> None:
        self._ticker = None
        self._flush()
        if self._tasks:
            self._ticker = asyncio.get_running_loop().call_later(self.FLUSH_S, self._tick)

    def _flush(self) -> None:
        for key, counts in self._done.items():
            completed, failed, flushed = counts
            if completed != flushed and key in self._tasks:
                counts[2] = completed
                self.progress.update(self._tasks[key], completed=completed,
                                     failed=f"[red]{failed} failed" if failed else "")
        self.progress.refresh()

    def level_done(self, run: object, target: object, level: LevelRun) -> None:
        self._done.pop((level.target, level.level), None)
        task = self._tasks.pop((level.target, level.level), None)
        if task is not None:
            self.progress.remove_task(task)
        ok = [r for r in level.records if r.ok]
        failed = sum(1 for r in level.records if not r.ok and r.error_kind != CANCELLED)
        lat = f", latency p50 {statistics.median(latency_ms(r) for r in ok):,.0f} ms" if ok else ""
        tail = f"  ({level.stopped_reason})" if level.stopped_reason else ""
        self.message(f"{level.target} {_short(level)}: {len(ok)} ok, {failed} failed, "
                     f"{throughput_tok_s(level.records):,.2f} tok/s{lat}{tail}")
        if self._on_level_done is not None:
            self._on_level_done()


def _short(level: LevelRun) -> str:
    return f"c={level.concurrency}" if level.rate is None else f"{level.rate:g} req/s"
