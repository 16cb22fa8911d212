"""Running a measurement to the end whatever happens: signals, checkpoints, the final atomic write.

Shared by every command that sends load (sweep, prefill, depth, soak). The first SIGINT/SIGTERM
cancels the run (in-flight requests are recorded as cancelled); a second one saves what there is
and leaves at once. Checkpoints are written by one thread, in order, off the event loop. The final
write happens with signals ignored, so it is never cut in half.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from ..core.clock import now_ns
from ..core.errors import EXIT_SIGINT, EXIT_SIGTERM
from ..results.writer import command_line, host_facts, utc_now, write_results
from ..run.loops import freeze_startup_heap, loop_factory
from ..run.model import Run

SIGNAL_EXIT = {signal.SIGINT: EXIT_SIGINT, signal.SIGTERM: EXIT_SIGTERM}

Checkpoint = Callable[[], None]


class FinalWriteError(Exception):
    """The results could not be written at the end; the message says where and why."""


@dataclass
class Execution:
    doc: dict[str, Any]
    signals: list[int] = field(default_factory=list)

    @property
    def exit_code_for_signal(self) -> int | None:
        return SIGNAL_EXIT.get(self.signals[0], 130) if self.signals else None


def execute(run: Run, out_dir: Path, main: Callable[[Checkpoint], Coroutine[Any, Any, None]], *,
            kind: str, err: Console) -> Execution:
    """Run `main(checkpoint)` on a fresh event loop, then write the results; return the document."""
    factory, loop_name = loop_factory()
    freeze_startup_heap()
    if loop_name != "uvloop":
        err.print("warning: uvloop is not installed; using the slower asyncio event loop", style="yellow")
    meta = {"kind": kind, "command": command_line(), "started_utc": utc_now().isoformat(),
            "host": host_facts(loop_name)}
    received: list[int] = []
    save_failures: list[str] = []
    writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="loadgen-checkpoint")

    def save() -> None:
        try:
            write_results(out_dir, run, meta=meta)
        except (OSError, ValueError) as exc:
            if not save_failures:
                err.print(f"warning: could not save a checkpoint to {out_dir} ({exc})", style="yellow")
            save_failures.append(str(exc))

    def checkpoint() -> None:
        writer.submit(save)

    async def guarded() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None

        def on_signal(signum: int) -> None:
            received.append(signum)
            if len(received) == 1:
                err.print(f"\n{signal.Signals(signum).name}: stopping, cancelling in-flight requests "
                          "(again to quit at once)", style="yellow")
                task.cancel()
            else:  # a second signal: keep what we have and leave now
                run.interrupted = True
                for t in run.targets:  # what is in flight is recorded as cancelled, levels end
                    for lv in t.levels:
                        lv.abandon(now_ns())
                save()
                os._exit(SIGNAL_EXIT.get(received[0], 130))

        for sig in SIGNAL_EXIT:
            loop.add_signal_handler(sig, on_signal, sig)
        try:
            await main(checkpoint)
        except asyncio.CancelledError:
            run.interrupted = True

    loop = factory()
    try:
        loop.run_until_complete(guarded())
    finally:
        loop.close()
        writer.shutdown(wait=True)
    # The loop's signal handlers are gone: let nothing interrupt the final write.
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in SIGNAL_EXIT}
    try:
        doc = write_results(out_dir, run, meta=meta)
    except (OSError, ValueError) as exc:
        raise FinalWriteError(f"could not write the results to {out_dir} ({exc})") from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return Execution(doc, received)
