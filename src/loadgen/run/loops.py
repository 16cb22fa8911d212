"""The process around the event loop: uvloop when it is installed (else plain asyncio), and the
garbage collector kept off the start-up heap."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable


def loop_factory(prefer_uvloop: bool = True) -> tuple[Callable[[], asyncio.AbstractEventLoop], str]:
    """Return a loop factory and its name ("uvloop" or "asyncio")."""
    if prefer_uvloop:
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.new_event_loop, "uvloop"
    return asyncio.new_event_loop, "asyncio"



def freeze_startup_heap() -> None:
    """Move every object alive now out of the garbage collector's sight.

    Imports (numpy, rich, aiohttp, ...) leave a few hundred thousand objects that live until exit.
    A full collection walks them all, which stalled the event loop for 20-30 ms in the middle of
    levels (a latency max of +33 ms in the 50 ms accuracy benchmark; +4 ms once frozen). Called
    once before the first level; what a run allocates afterwards is collected as usual.
    """
    gc.collect()
    gc.freeze()
