"""What the user sees while a run works: a progress bar per level (sweep) or step (prefill, depth)
and a line when each finishes; a live status line during a soak."""

from __future__ import annotations

import asyncio
import statistics
from collections import Counter, deque
from collections.abc import Callable, Sequence
from typing import Any, Self

from rich.console import Console
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from ..analysis.aggregate import of_level
from ..analysis.metrics import prompt_tok_s
from ..core.clock import now_ns
from ..core.records import CLIENT_SIDE, LevelRun, RequestRecord, level_short


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
        self._tasks: dict[tuple[str, int | float, str | None], int] = {}
        # Completions are counted here and handed to Rich every FLUSH_S by a timer on the event loop.
        # A Rich update per request, or Rich's own refresh thread (which makes the loop's thread
        # fight for the GIL), cost more than the engine's whole bookkeeping at thousands of req/s.
        # (target, level, request class) -> [completed, failed, flushed]
        self._done: dict[tuple[str, int | float, str | None], list[int]] = {}

    def __enter__(self) -> Self:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        self.progress.stop()

    def message(self, text: str) -> None:
        console = self.progress.console  # a message stays one line in a file or pipe (for grep)
        console.print(text, highlight=False, markup=False, soft_wrap=not console.is_terminal)

    def level_started(self, level: LevelRun, requests: int | None, duration_s: float | None) -> None:
        what = f"{level.target} {_short(level)}" + (f" {duration_s:g}s" if duration_s is not None else "")
        key = _level_key(level)
        self._done[key] = [0, 0, 0]
        self._tasks[key] = self.progress.add_task(what, total=requests, failed="")
        if self._ticker is None and not self.progress.disable:
            self._ticker = asyncio.get_running_loop().call_later(self.FLUSH_S, self._tick)

    def request_done(self, record: RequestRecord) -> None:
        counts = self._done.get((record.target, record.level, record.request_class))
        if counts is not None:
            counts[0] += 1
            if not record.ok:
                counts[1] += 1

    def requests_counted(self, level: LevelRun, completed: int, failed: int) -> None:
        """Requests that completed in a worker process, counted there (run/workers/parent.py)."""
        self._add(_level_key(level), completed, failed)

    def requests_done(self, batch: Sequence[RequestRecord]) -> None:
        """Records that completed in a worker process, a read of its file at a time: one level's."""
        if batch:
            first = batch[0]
            self._add((first.target, first.level, first.request_class), len(batch),
                      sum(r.error_kind is not None for r in batch))

    def _add(self, key: tuple[str, int | float, str | None], completed: int, failed: int) -> None:
        counts = self._done.get(key)
        if counts is not None:
            counts[0] += completed
            counts[1] += failed

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
        self._done.pop(_level_key(level), None)
        task = self._tasks.pop(_level_key(level), None)
        if task is not None:
            self.progress.remove_task(task)
        # run.json's figures (the level's aggregate, HdrHistogram p50): one level, one p50.
        s = of_level(level).summary(level.concurrency, rate=level.rate)
        lat = f", latency p50 {s.latency_ms.p50:,.0f} ms" if s.latency_ms is not None else ""
        tail = f"  ({level.stopped_reason})" if level.stopped_reason else ""
        # an API that answers without generating (embeddings, rerank): its prompt tokens/s instead
        rate = (f"{s.throughput_tok_s:,.2f} tok/s" if s.output_tokens or not s.input_tokens
                else f"{s.total_tok_s or 0:,.2f} prompt tok/s")
        self.message(f"{level.target} {_short(level)}: {s.requests_ok} ok, {s.requests_failed} failed, "
                     f"{rate}{lat}{tail}")
        if self._on_level_done is not None:
            self._on_level_done()


def _short(level: LevelRun) -> str:
    """"c=4", "2 req/s"; a class's level: "chat alone c=1"."""
    short = level_short(level.level, level.rate is not None)
    return short if level.request_class is None else f"{level.request_class} {level.phase} {short}"


def _level_key(level: LevelRun) -> tuple[str, int | float, str | None]:
    """A level's progress bar: classes side by side share a level key, not a class."""
    return level.target, level.level, level.request_class


class StepProgress(ProgressObserver):
    """prefill and depth: a bar per step ("label 512 tok"), one line of figures when it ends."""

    def __init__(self, console: Console, kind: str, on_step_done: Callable[[], None] | None = None):
        super().__init__(console)
        self.kind = kind
        self._on_step_done = on_step_done
        self._step_text = ""

    def step_started(self, target: Any, step: Any) -> None:
        self._step_text = f"{step.size:,} tok" if self.kind == "prefill" else f"depth {step.size:,}"

    def level_started(self, level: LevelRun, requests: int | None, duration_s: float | None) -> None:
        super().level_started(level, requests, duration_s)
        self.progress.update(self._tasks[_level_key(level)], description=f"{level.target} {self._step_text}")

    def level_done(self, run: object, target: object, level: LevelRun) -> None:
        self._done.pop(_level_key(level), None)
        task = self._tasks.pop(_level_key(level), None)
        if task is not None:
            self.progress.remove_task(task)

    def step_done(self, run: Any, target: Any, step: Any) -> None:
        what = f"{target.label} {step.size:,} tok" if self.kind == "prefill" else f"{target.label} depth {step.size:,}"
        if step.skipped:
            self.message(f"{what}: {step.skipped}")
        elif step.level is not None:
            ok = [r for r in step.level.records if r.ok]
            failed = sum(1 for r in step.level.records if not r.ok and r.error_kind not in CLIENT_SIDE)
            figures = []
            if ok:
                prompt_n = sorted({r.prompt_n for r in ok if r.prompt_n is not None})
                figures.append(f"prompt_n {'/'.join(map(str, prompt_n)) or 'n/a'}")
                if self.kind == "prefill":
                    speeds = [s for r in ok if (s := prompt_tok_s(r)) is not None]
                    ms = [r.prompt_ms for r in ok if r.prompt_ms is not None]
                    if ms:
                        figures.append(f"prompt_ms {statistics.mean(ms):,.0f}")
                    if speeds:
                        figures.append(f"{statistics.mean(speeds):,.1f} prompt tok/s")
                else:
                    speeds = [r.predicted_per_second for r in ok if r.predicted_per_second is not None]
                    if speeds:
                        figures.append(f"{statistics.mean(speeds):,.2f} decode tok/s")
            tail = f"  ({step.level.stopped_reason})" if step.level.stopped_reason else ""
            self.message(f"{what}: {len(ok)} ok, {failed} failed" + "".join(f", {f}" for f in figures) + tail)
        if self._on_step_done is not None:
            self._on_step_done()


class SoakStatus:
    """soak: one live status line (elapsed, requests, errors by kind, throughput over the last
    minute), redrawn every second by a timer on the event loop; in a log (not a terminal) the
    same line is printed every `log_every_s`."""

    WINDOW_S = 60.0
    REFRESH_S = 1.0

    def __init__(self, console: Console, duration_s: float, log_every_s: float = 60.0):
        self.console = console
        self.duration_s = duration_s
        self.log_every_s = log_every_s
        self._live: Live | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._start_ns: int | None = None
        self._last_log_ns = 0
        self._ok: dict[str, int] = {}
        self._errors: dict[str, Counter] = {}
        self._recent: dict[str, deque] = {}  # target -> (complete_ns, tokens) of the last minute

    def __enter__(self) -> SoakStatus:
        if self.console.is_terminal:
            self._live = Live(Text(""), console=self.console, auto_refresh=False, transient=True)
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._live is not None:
            self._live.stop()

    def message(self, text: str) -> None:
        self.console.print(text, highlight=False, markup=False)

    def level_started(self, level: LevelRun, requests: int | None, duration_s: float | None) -> None:
        target = level.target
        self._ok.setdefault(target, 0)
        self._errors.setdefault(target, Counter())
        self._recent.setdefault(target, deque())
        if self._start_ns is None:
            self._start_ns = self._last_log_ns = now_ns()
            self._timer = asyncio.get_running_loop().call_later(self.REFRESH_S, self._tick)

    def request_done(self, record: RequestRecord) -> None:
        if record.ok:
            self._ok[record.target] = self._ok.get(record.target, 0) + 1
            tokens = record.predicted_n if record.predicted_n is not None else (record.tokens_predicted or 0)
            self._recent.setdefault(record.target, deque()).append((record.complete_ns, tokens))
        elif record.error_kind not in CLIENT_SIDE:
            self._errors.setdefault(record.target, Counter())[record.error_kind] += 1

    def level_done(self, run: object, target: object, level: LevelRun) -> None:
        pass

    def status_line(self, now: int | None = None) -> str:
        now = now_ns() if now is None else now
        elapsed = (now - (self._start_ns or now)) / 1e9
        parts = [f"soak {_clock(elapsed)} / {_clock(self.duration_s)}"]
        horizon = now - int(self.WINDOW_S * 1e9)
        span = min(self.WINDOW_S, max(elapsed, 1e-9))
        for target, recent in self._recent.items():
            while recent and recent[0][0] < horizon:
                recent.popleft()
            errors = self._errors.get(target) or Counter()
            error_text = ", ".join(f"{k} ×{n}" for k, n in sorted(errors.items())) or "no errors"
            parts.append(f"{target}: {self._ok.get(target, 0):,} ok, {error_text}, "
                         f"{sum(n for _, n in recent) / span:,.1f} tok/s over the last minute")
        return " · ".join(parts)

    def _tick(self) -> None:
        now = now_ns()
        line = self.status_line(now)
        if self._live is not None:
            self._live.update(Text(line), refresh=True)
        elif (now - self._last_log_ns) / 1e9 >= self.log_every_s:
            self._last_log_ns = now
            self.message(line)
        self._timer = asyncio.get_running_loop().call_later(self.REFRESH_S, self._tick)


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
