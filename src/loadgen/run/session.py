"""A run's session: its event loop, its signals and its checkpoints, from the first request to the
final atomic write, whatever happens.

Shared by every command that sends load (sweep, prefill, depth, soak); the command passes in the
`ResultsWriter` (results/ sits above run/, so run/ knows it only by this interface) and prints
what comes back. The first SIGINT/SIGTERM
cancels the run (in-flight requests are recorded as cancelled); a second one saves what there is
and leaves at once. Checkpoints are written by one thread, in order, off the event loop. From before
the event loop starts until the process exits, SIGINT/SIGTERM are loadgen's: a signal that comes
after the run ended (during the final write, the tables) is recorded and only sets the exit code
(`signals.LATCH`, released by the entry point), so the final write is never cut in half and the
exit code is 130/143 whenever it lands. Checkpoints come from one timer (`checkpoint_every_s`) and
from the run's own moments (a level done), never from a second timer.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from rich.console import Console

from ..core.clock import now_ns
from ..core.signals import LATCH, SIGNAL_EXIT
from .loops import freeze_startup_heap, loop_factory
from .state import Run

Checkpoint = Callable[[], None]
# run.json is rewritten this often during a run (the records stream on their own), so a run killed
# mid-level leaves that level's figures at most this old. Not more often: the summary is computed
# in a thread that shares the interpreter with the event loop, and a level of a few seconds
# measured with it in the middle measured the client (a saturation table test moved its knee).
SUMMARY_EVERY_S = 60.0


async def _ticking(work: Coroutine[Any, Any, None], interval_s: float, call: Callable[[], None]) -> None:
    """Await `work`, calling `call` every `interval_s` meanwhile."""
    async def every() -> None:
        while True:
            await asyncio.sleep(interval_s)
            call()

    ticks = asyncio.ensure_future(every())
    try:
        await work
    finally:
        ticks.cancel()


def close_probe_sink(run: Run) -> None:
    """Close the probe's sink (its samples written); from then on run.json's writer writes them."""
    sink, run.probe_sink = run.probe_sink, None
    if sink is not None:
        sink.close()


class FinalWriteError(Exception):
    """The results could not be written at the end; the message says where and why."""


class ResultsWriter(Protocol):
    """Where a run's results go (results/writer.py's `RunFiles`). `start` opens the records file the
    run streams into (`run.sink`) and writes run.json before the first request; `checkpoint` rewrites
    run.json with what there is (never `complete`); `final` writes it for the last time and returns
    the document. Each raises OSError or ValueError when it cannot write."""

    where: str  # for messages: the results folder

    def start(self, run: Run, event_loop: str) -> None: ...

    def checkpoint(self, run: Run) -> None: ...

    def final(self, run: Run) -> dict[str, Any]: ...


@dataclass
class Execution:
    doc: dict[str, Any]
    signals: list[int] = field(default_factory=list)

    @property
    def exit_code_for_signal(self) -> int | None:
        return SIGNAL_EXIT.get(self.signals[0], 130) if self.signals else None


def execute(run: Run, results: ResultsWriter, main: Callable[[Checkpoint], Coroutine[Any, Any, None]], *,
            err: Console, checkpoint_every_s: float = SUMMARY_EVERY_S) -> Execution:
    """Run `main(checkpoint)` on a fresh event loop, checkpointing every `checkpoint_every_s` (and
    whenever `main` calls `checkpoint`), then write the results; return the document. Records stream
    to their file as they complete (`results.start` opens it)."""
    factory, loop_name = loop_factory()
    freeze_startup_heap()
    if loop_name != "uvloop":
        err.print("warning: uvloop is not installed; using the slower asyncio event loop", style="yellow")
    save_failures: list[str] = []
    writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="loadgen-checkpoint")
    try:
        results.start(run, loop_name)
    except OSError as exc:
        raise FinalWriteError(f"could not write the results to {results.where} ({exc})") from None
    sink = run.sink
    assert sink is not None  # ResultsWriter.start opens the records file the run streams into

    def save() -> None:
        try:
            results.checkpoint(run)
        except (OSError, ValueError) as exc:
            if not save_failures:
                err.print(f"warning: could not save a checkpoint to {results.where} ({exc})", style="yellow")
            save_failures.append(str(exc))

    def checkpoint() -> None:
        writer.submit(save)

    run.checkpoint = checkpoint

    state: dict[str, Any] = {"loop": None, "task": None, "leaving": False}

    def leave_now() -> None:
        """A second signal while the run goes on: keep what we have and exit at once."""
        run.interrupted = True
        for t in run.targets:  # what is in flight is recorded as cancelled, levels end
            for lv in t.levels:
                lv.abandon(now_ns())
        with contextlib.suppress(OSError):
            sink.close()
        with contextlib.suppress(OSError):
            close_probe_sink(run)
        save()
        os._exit(SIGNAL_EXIT.get(received[0], 130))

    def on_signal(signum: int) -> None:
        # Called by the process's signal handler (the latch), in the main thread between bytecodes,
        # from before the loop starts until the command exits (the loop's own handlers would leave
        # windows while they are installed and removed): it only hands the work to the loop.
        loop, task = state["loop"], state["task"]
        if loop is None or task is None or task.done() or loop.is_closed():
            return  # the run is over: the final write goes on, the exit code says which signal came
        if len(received) == 1:
            loop.call_soon_threadsafe(announce_and_cancel, signum)
        elif not state["leaving"]:
            state["leaving"] = True
            loop.call_soon_threadsafe(leave_now)

    def announce_and_cancel(signum: int) -> None:
        err.print(f"\n{signal.Signals(signum).name}: stopping, cancelling in-flight requests "
                  "(again to quit at once)", style="yellow")
        state["task"].cancel()

    async def guarded() -> None:
        state["task"] = asyncio.current_task()
        if received:  # a signal came while the loop was being made: nothing to run
            run.interrupted = True
            return
        try:
            await _ticking(main(checkpoint), checkpoint_every_s, checkpoint)
        except asyncio.CancelledError:
            run.interrupted = True

    LATCH.install()
    received = LATCH.received
    LATCH.listen(on_signal)
    loop = factory()
    state["loop"] = loop
    try:
        loop.run_until_complete(guarded())
    finally:
        LATCH.listen(None)  # from here a signal is only recorded: the final write is never cut short
        loop.close()
        writer.shutdown(wait=True)
    run.checkpoint = None
    try:
        sink.close()
        close_probe_sink(run)
        doc = results.final(run)
    except (OSError, ValueError) as exc:
        raise FinalWriteError(f"could not write the results to {results.where} ({exc})") from None
    return Execution(doc, received)
