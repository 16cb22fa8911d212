"""Event-loop choice, isolated: uvloop when it is installed, plain asyncio otherwise."""

from __future__ import annotations

import asyncio
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

