"""The cache modes a run can ask for, as typed records the run's config carries and run.json says.

A normal run salts every prompt at its start and sends `cache_prompt: false`, so the server never
reuses a token (raw prefill and decode). A cache mode sends `cache_prompt: true` and shapes its
prompts so that reuse is what a real client would cause:

- `SharedPrefix`: requests in `groups` groups; a group's requests share a system prompt of exactly
  `prefix_tokens` tokens (per server) and differ after it (the salt follows the shared part).
  Request i belongs to group i mod groups. `cache_prompt` False keeps the shapes, cache off: a run to read
  beside the cached one (compare refuses the pair).
- `MultiTurn`: `users` conversations of `turns` turns each (run/multiturn.py); each turn re-sends
  the whole history (the earlier prompts and the server's own answers) plus a new message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class SharedPrefix:
    prefix_tokens: int  # the shared system prompt, exactly this many tokens (BOS not counted)
    groups: int = 1
    prompt_tokens: int = 0  # the whole prompt (BOS, prefix, salt, own text); 0: prefix + 64
    cache_prompt: bool = True

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens or self.prefix_tokens + 64

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "shared_prefix", "prefix_tokens": self.prefix_tokens, "groups": self.groups,
                "prompt_tokens": self.total_tokens, "cache_prompt": self.cache_prompt}


@dataclass(frozen=True, slots=True)
class MultiTurn:
    users: int
    turns: int
    message_tokens: int = 64  # each new user message, about this many tokens
    think_s: float = 0.0  # the pause between a user's answer and their next message
    think_jitter_s: float = 0.0  # plus a uniform draw in [0, jitter) per pause (seeded)
    pin_slots: bool = False  # user u always asks for slot u mod the server's slots
    cache_prompt: bool = True
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "multi_turn", "users": self.users, "turns": self.turns, "message_tokens": self.message_tokens,
                "think_s": self.think_s, "think_jitter_s": self.think_jitter_s, "pin_slots": self.pin_slots,
                "cache_prompt": self.cache_prompt, "seed": self.seed}


def cache_of(config: dict[str, Any] | None) -> dict[str, Any] | None:
    """A run.json config's cache mode (None: a normal run, cache off)."""
    cache = (config or {}).get("cache")
    return cache if isinstance(cache, dict) else None


def cache_on(config: dict[str, Any] | None) -> bool:
    """Whether a run.json config sent `cache_prompt: true` (older files: never)."""
    return bool((config or {}).get("cache_prompt"))
