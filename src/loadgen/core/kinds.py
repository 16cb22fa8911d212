"""The run kinds: the one list of the commands that write a run (run.json's "kind").

Like client/registry.py's transports, each kind is named here with import strings, imported only
when it is used: listing the kinds (`loadgen --help`, a scenario's `mode`, `analyze` asking how a
kind is shown) loads none of their commands. Adding a command that writes a run is a folder under
`loadgen/kinds/` and one line in KINDS (docs/development.md, "Adding a command"); sweep and demo,
the load every other command builds on, stay in `loadgen/cli/sweep.py`.

A kind's *view* (output/kind_view.py `KindView`) says how a run of it is shown beyond a sweep's
level tables: the tables of a kind without levels, and its answer line for `analyze` and `report`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

RUN_LOAD, FIND_LIMITS = "Run load", "Find limits"  # the help groups (cli/main.py COMMAND_GROUPS) kinds join


@dataclass(frozen=True, slots=True)
class Kind:
    """One run kind: its name (run.json's "kind", and the command's), where its command and view live,
    its line and group in `loadgen --help`, and what its run.json holds."""

    name: str
    command: str  # "module:attribute" of its click command
    help: str  # its one-line help, as the command's docstring begins (a test holds them equal)
    group: str = RUN_LOAD
    levels: bool = True  # levels and verdicts (a sweep's tables), rather than one section per target
    section: str | None = None  # the per-target section of run.json a kind without levels writes
    # A kind whose section is a table of rows: the row figure (key) a grid cell is summarised by, and
    # its words ("prompt tok/s"); run.json's row key for the row's size comes first.
    figure: tuple[str, str] | None = None
    view: str | None = None  # "module:attribute" of its KindView; None: a sweep's tables, no answer line
    # "module:function" building its run.json section of a target, `f(target_run, run) -> dict`, for a
    # kind without levels whose section the results writer does not know by name (imported when written).
    section_writer: str | None = None
    scenario: bool = True  # a scenario file may name it as its `mode` (`loadgen run`)


# In `loadgen --help` order within each group (demo first: it needs no server).
KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("demo", "loadgen.cli.sweep:demo",
         "Sweep two simulated llama-servers (MoE vs dense, 4 slots each) in under a minute, no model needed.",
         scenario=False),
    Kind("sweep", "loadgen.cli.sweep:sweep",
         "Sweep concurrency levels (or request rates) against one or more servers, side by side."),
    Kind("replay", "loadgen.kinds.replay.command:replay_command",
         "Replay a trace (Mooncake JSONL, or time/input/output CSV or JSONL) at its own times, open loop."),
    Kind("chat", "loadgen.kinds.chat.command:chat_command",
         "Multi-turn conversations that re-send their real history: prompt_n, cache_n, TTFT per turn."),
    Kind("prefix", "loadgen.kinds.prefix.command:prefix_command",
         "Groups of requests sharing an exact system prompt, cache on: hit ratio, TTFT of hits vs misses."),
    Kind("soak", "loadgen.kinds.soak.command:soak_command",
         "Steady load for hours: errors by kind, error-free time and throughput drift, checkpointed as it goes.",
         levels=False, section="soak", view="loadgen.kinds.soak.view:VIEW"),
    Kind("capacity", "loadgen.kinds.capacity.command:capacity_command",
         "Find the most concurrent users (or req/s) a server serves within latency targets (--slo), and why.",
         FIND_LIMITS, view="loadgen.kinds.capacity.view:VIEW"),
    Kind("cache-capacity", "loadgen.kinds.cache_capacity.command:cache_capacity_command",
         "How many conversations the prompt cache keeps warm: K round-robin, K raised level by level.",
         FIND_LIMITS),  # its answer is its folder's (cache-capacity.json), read by analyze and report
    Kind("prefill", "loadgen.kinds.prefill.command:prefill_command",
         "Prefill speed per prompt length: prompt_n, prompt_ms, prompt tok/s and client TTFT per server.",
         FIND_LIMITS, levels=False, section="prefill", figure=("prompt_tok_s", "prompt tok/s"),
         view="loadgen.kinds.prefill.view:VIEW"),
    Kind("depth", "loadgen.kinds.depth.command:depth_command",
         "Decode speed after a context filled to each depth, and its drop against depth 0 (llama-bench -d).",
         FIND_LIMITS, levels=False, section="depth", figure=("decode_tok_s", "decode tok/s"),
         view="loadgen.kinds.depth.view:VIEW"),
    Kind("slots", "loadgen.kinds.slots.command:slots_command",
         "Save a conversation's slot, forget it, restore it: the next turn's cache_n and TTFT, save/restore time.",
         FIND_LIMITS, levels=False, section="slots", view="loadgen.kinds.slots.view:VIEW",
         section_writer="loadgen.kinds.slots.section:section"),
    Kind("wake", "loadgen.kinds.wake.command:wake_command",
         "A server waking from sleep (--sleep-idle-seconds): what a request that finds it asleep waits.",
         FIND_LIMITS, levels=False, section="wake", view="loadgen.kinds.wake.view:VIEW",
         section_writer="loadgen.kinds.wake.section:section"),
)}


class RunKind(enum.StrEnum):
    """Which command wrote the run (run.json's "kind"; before schema version 4, `capacity`, `replay`,
    `prefix`, `chat` and `cache-capacity` runs said "sweep"). Its members are KINDS' names (a test
    holds them equal); what a kind is lives in KINDS."""

    SWEEP = "sweep"
    DEMO = "demo"
    CAPACITY = "capacity"
    REPLAY = "replay"
    PREFIX = "prefix"
    CHAT = "chat"
    CACHE_CAPACITY = "cache-capacity"
    PREFILL = "prefill"
    DEPTH = "depth"
    SOAK = "soak"
    SLOTS = "slots"
    WAKE = "wake"

    @property
    def kind(self) -> Kind:
        return KINDS[self.value]

    @property
    def has_levels(self) -> bool:
        """Levels and verdicts (a sweep's tables), rather than one section per target."""
        return KINDS[self.value].levels
