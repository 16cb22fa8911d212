"""The simulator's host-memory prompt cache, as llama-server's `--cache-ram` keeps one.

As build 11434's source has it (tools/server/server-task.cpp, server_prompt_cache's alloc and
load; docs/cache.md): an entry is a slot's saved tokens (its prompt and the answer tokens decoded
after it). Saving skips tokens a kept entry already starts with, drops the entries the new one
starts with, never keeps one larger than the whole capacity, and evicts the oldest entries until
the new one fits beside the rest, before adding it. Restoring takes the entry that keeps more of
itself and more of the prompt than the slot's own tokens (at least a quarter of the entry
matching), and the entry leaves the cache. Order is by insertion: a hit does not refresh an entry.
The cache holds at most `capacity_tokens` tokens (llama-server counts MiB of the saved state: about
the same bound at a model's bytes per token). Capacity 0: no host cache.
"""

from __future__ import annotations

# server_prompt_cache::load restores no entry of which less than this share matches the prompt.
RESTORE_MIN_KEEP = 0.25


def common_prefix(a: list[int] | tuple[int, ...], b: list[int] | tuple[int, ...]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class HostPromptCache:
    def __init__(self, capacity_tokens: int):
        self.capacity_tokens = capacity_tokens
        self._entries: list[tuple[int, ...]] = []  # oldest first
        self.tokens = 0
        self.saves = self.loads = self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def save(self, tokens: list[int]) -> bool:
        """Keep a copy of a slot's tokens (server_prompt_cache::alloc); False when not kept: empty,
        larger than the capacity, or already the start of a kept entry."""
        key = tuple(tokens)
        if not key or len(key) > self.capacity_tokens:
            return False
        if any(common_prefix(entry, key) == len(key) for entry in self._entries):
            return False
        self._entries = [entry for entry in self._entries if common_prefix(entry, key) < len(entry)]
        self.tokens = sum(len(entry) for entry in self._entries)
        while self._entries and self.tokens + len(key) > self.capacity_tokens:
            self.tokens -= len(self._entries.pop(0))
            self.evictions += 1
        self._entries.append(key)
        self.tokens += len(key)
        self.saves += 1
        return True

    def take(self, prompt: tuple[int, ...], own: list[int]) -> list[int] | None:
        """The entry to restore for `prompt` over the slot's `own` tokens (server_prompt_cache::load):
        one that keeps a larger share of itself and covers a larger share of the prompt; it leaves
        the cache. None: the slot keeps its own."""
        lcp = common_prefix(own, prompt)
        keep_best = lcp / len(own) if own else -1.0
        sim_best = lcp / len(prompt) if prompt else 0.0
        found = None
        for i, entry in enumerate(self._entries):
            n = common_prefix(entry, prompt)
            keep, sim = n / len(entry), n / len(prompt) if prompt else 0.0
            if keep >= RESTORE_MIN_KEEP and keep_best < keep and sim_best < sim:
                found, keep_best, sim_best = i, keep, sim
        if found is None:
            return None
        entry = self._entries.pop(found)
        self.tokens -= len(entry)
        self.loads += 1
        return list(entry)
