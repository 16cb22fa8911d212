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



# Tracked allocations between two young-generation collections while levels run (CPython's default
# is 700). See freeze_startup_heap.
GC_YOUNG_THRESHOLD = 20_000


def freeze_startup_heap() -> None:
    """Move every object alive now out of the garbage collector's sight, and collect the young
    generation less often.

    Imports (numpy, rich, aiohttp, ...) leave a few hundred thousand objects that live until exit.
    A full collection walks them all, which stalled the event loop for 20-30 ms in the middle of
    levels (a latency max of +33 ms in the 50 ms accuracy benchmark; +4 ms once frozen). Called
    once before the first level (and by each worker process before its first); what a run allocates
    afterwards is collected as usual.

    At the default threshold a young collection came every few hundred records, and each walked the
    batch of records not yet written (a streamed record's gap list is a tracked object too): a
    third of the time spent decoding a worker's records, and a fifth of the parent's CPU with
    `--workers 2` streaming (0.23 -> 0.18 of a core at a higher rate). Every 20,000 allocations
    instead, the same walks come 30 times less often; the young generation stays a few MB.
    """
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)
