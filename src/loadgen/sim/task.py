"""A request inside the simulator, and what the scheduler sends back to its HTTP handler.

The handler owns a `Task` and reads its events; the scheduler writes them. Events are plain frozen
data, so nothing the handler does can change what the scheduler decided.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Any

from .params import CompletionParams


@dataclass(frozen=True, slots=True)
class Timings:
    """A request's `timings`, from wall-clock times measured in the simulator (see scheduler.py).

    prompt_ms    slot starts the prompt -> first token sampled (queue wait excluded)
    predicted_ms first token sampled -> last token sampled
    """

    cache_n: int  # prompt tokens reused from the slot's cache
    prompt_n: int  # prompt tokens computed
    prompt_ms: float
    predicted_n: int  # generated tokens, the first included
    predicted_ms: float

    def to_json(self) -> dict[str, Any]:
        """Rates as llama-server computes them, kept finite (0 when there is nothing to divide):

        prompt_per_token_ms    = prompt_ms / prompt_n
        prompt_per_second      = prompt_n / prompt_ms * 1000
        predicted_per_token_ms = predicted_ms / (predicted_n - 1)
        predicted_per_second   = (predicted_n - 1) / predicted_ms * 1000
        The first token comes from the prompt's last batch, so the decode rates are over the
        predicted_n - 1 decode steps that predicted_ms spans.
        """
        steps = self.predicted_n - 1
        return {
            "cache_n": self.cache_n,
            "prompt_n": self.prompt_n,
            "prompt_ms": self.prompt_ms,
            "prompt_per_token_ms": self.prompt_ms / self.prompt_n if self.prompt_n > 0 else 0.0,
            "prompt_per_second": self.prompt_n / self.prompt_ms * 1e3 if self.prompt_ms > 0 else 0.0,
            "predicted_n": self.predicted_n,
            "predicted_ms": self.predicted_ms,
            "predicted_per_token_ms": self.predicted_ms / steps if steps > 0 else 0.0,
            "predicted_per_second": steps / self.predicted_ms * 1e3 if steps > 0 and self.predicted_ms > 0 else 0.0,
        }


@dataclass(frozen=True, slots=True)
class CompletionResult:
    """Everything a final response needs, whatever its API shape."""

    content: str
    tokens: tuple[int, ...]  # generated token ids (only with return_tokens)
    id_slot: int
    n_decoded: int
    n_prompt_tokens: int
    n_tokens_cached: int  # tokens in the slot's KV cache now
    stop_type: str  # none | eos | word | limit
    stopping_word: str
    truncated: bool
    has_new_line: bool
    timings: Timings


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One sampled token, sent to streaming requests only."""

    text: str  # may be "" (EOS, or text held back while it may be the start of a stop word)
    token: int
    n_decoded: int
    id_slot: int
    n_prompt_tokens: int
    timings: Timings | None  # only with timings_per_token


@dataclass(frozen=True, slots=True)
class FinalEvent:
    result: CompletionResult


@dataclass(frozen=True, slots=True)
class ErrorEvent:
    status: int
    error: dict[str, Any]  # the object under "error": code, message, type (and extras)


Event = TokenEvent | FinalEvent | ErrorEvent


class Task:
    """One completion request from submission until its final or error event."""

    __slots__ = ("id", "params", "rng", "completion_id", "events", "cancelled", "id_slot")

    def __init__(self, task_id: int, params: CompletionParams, server_seed: int):
        self.id = task_id
        self.params = params
        # A request's own seed makes its output repeatable on any server; otherwise the server's
        # seed and the task's number do.
        self.rng = random.Random(params.seed if params.seed >= 0 else f"{server_seed}:{task_id}")
        id_rng = random.Random(f"{server_seed}:id:{task_id}")
        self.completion_id = "chatcmpl-" + "".join(id_rng.choices(_ALNUM, k=32))
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.cancelled = False
        self.id_slot = -1

    def emit(self, event: Event) -> None:
        self.events.put_nowait(event)

    async def next_event(self) -> Event:
        return await self.events.get()


_ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
