"""A --lora-mix run's records per adapter (core/lora_mix.py): how the requests of each level were
shared among the adapters, what each adapter's requests got, and whether the server applied the
adapter each request asked for.

Pure: records in, figures out. A record's `lora` is the adapter it asked for; its `lora_applied`
what llama-server's answer said it applied (`generation_settings.lora`), None where the answer says
nothing (the OpenAI APIs): such requests are counted as not told, never as checked.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ..core.records import RequestRecord


@dataclass(slots=True)
class AdapterShare:
    """One adapter's requests at one level of one target."""

    adapter: str  # "0", "1", ... or "none"
    requests: int = 0  # sent (every record but the client's own cancellations)
    ok: int = 0
    output_tokens: int = 0  # of the successful requests, as the server counted them
    latency_ms: list[float] = field(default_factory=list)  # of the successful requests
    told: int = 0  # successful requests whose answer said which adapters applied
    mismatched: list[int] = field(default_factory=list)  # seqs whose applied adapters differ from those asked

    @property
    def latency_p50_ms(self) -> float | None:
        values = sorted(self.latency_ms)
        if not values:
            return None
        mid = len(values) // 2
        return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


@dataclass(frozen=True, slots=True)
class LevelShares:
    """A level's requests per adapter, in the adapters' order of first appearance by seq."""

    target: str
    level: int | float
    adapters: tuple[AdapterShare, ...]

    @property
    def requests(self) -> int:
        return sum(a.requests for a in self.adapters)

    def share(self, adapter: AdapterShare) -> float:
        """`adapter`'s share of the level's requests (0..1)."""
        return adapter.requests / self.requests if self.requests else 0.0


def adapter_shares(records: Iterable[RequestRecord]) -> list[LevelShares]:
    """Per (target, level), in the order met, each adapter's requests; records without an adapter
    (not a --lora-mix run) and the client's own cancellations are left out."""
    levels: dict[tuple[str, int | float], dict[str, AdapterShare]] = {}
    for r in sorted((r for r in records if r.lora is not None), key=lambda r: r.seq):
        if r.error_kind in ("cancelled", "lost"):
            continue
        assert r.lora is not None
        shares = levels.setdefault((r.target, r.level), {})
        a = shares.setdefault(r.lora, AdapterShare(r.lora))
        a.requests += 1
        if not r.ok:
            continue
        a.ok += 1
        a.output_tokens += r.output_tokens or 0
        a.latency_ms.append((r.complete_ns - r.start_ns) / 1e6)
        if r.lora_applied is not None:
            a.told += 1
            if r.lora_applied != r.lora:
                a.mismatched.append(r.seq)
    return [LevelShares(target, level, tuple(shares.values())) for (target, level), shares in levels.items()]
