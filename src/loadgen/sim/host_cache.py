"""The simulator's host-memory prompt cache, as llama-server's `--cache-ram` keeps one.

When a slot is about to take a prompt its cache does not start with, llama-server saves the
slot's cached tokens to a host-memory cache (`prompt_save`), then restores from it the saved
prompt that shares the longest prefix with the new one when that beats the slot's own
(`prompt_load`). The cache holds at most `capacity_tokens` tokens (llama-server counts MiB of
KV state: the same bound at a model's bytes per token); the least recently used entries go first.
An entry larger than the whole capacity is never kept. Capacity 0: no host cache.
"""

from __future__ import annotations

from collections import OrderedDict


def common_prefix(a: list[int] | tuple[int, ...], b: list[int] | tuple[int, ...]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class HostPromptCache:
    def __init__(self, capacity_tokens: int):
        self.capacity_tokens = capacity_tokens
        self._entries: OrderedDict[tuple[int, ...], None] = OrderedDict()
        self.tokens = 0
        self.saves = self.loads = self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def save(self, tokens: list[int]) -> None:
        """Keep a copy of a slot's cached tokens (most recent), evicting the least recently used
        entries until it fits; an entry already kept, or covered by a kept one, only moves up."""
        key = tuple(tokens)
        if not key or len(key) > self.capacity_tokens:
            return
        if key in self._entries:
            self._entries.move_to_end(key)
            return
        self._entries[key] = None
        self.tokens += len(key)
        self.saves += 1
        while self.tokens > self.capacity_tokens:
            old, _ = self._entries.popitem(last=False)
            self.tokens -= len(old)
            self.evictions += 1

    def best(self, prompt: tuple[int, ...], beat: int) -> list[int] | None:
        """The kept entry sharing the longest prefix with `prompt`, if longer than `beat` tokens
        (what the slot already has); it becomes the most recently used."""
        found, length = None, beat
        for key in self._entries:
            n = common_prefix(key, prompt)
            if n > length:
                found, length = key, n
        if found is None:
            return None
        self._entries.move_to_end(found)
        self.loads += 1
        return list(found)
