"""A replayed trace's prompts for one target, block by block, so that shared blocks share a prefix.

Each hash id h stands for one fixed text: the first `block_tokens` − 1 pieces of synthetic prose
seeded by h (this server's tokenizer), and a newline, so every block ends at a token boundary the
next block cannot merge across. A request of length L with blocks h1..hm is

    text(h1) + ... + text(hk) + "[<salt>] " + filler

where k ≤ m is the most blocks that leave room for the salt and one token of filler, and the
filler is cut (run/exact_prompt.fit_prompt) so the whole is L tokens: L − (the k blocks' tokens,
measured once per prefix) for "[<salt>] " + filler with the BOS token. Requests that share their
first blocks share those blocks' text on the wire, salt after; requests without hash ids are
salted at the start as in a sweep.

`TraceSource` is the run's request source when a trace is replayed (run/request_source.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..client.backends import CHAT_TEMPLATE_APIS, GenerationParams
from ..client.tokenize import Tokenizer, TokenizeUnavailable, server_tokenizer
from ..core.workload import RequestShape
from .config import SweepConfig
from .engine import EngineOptions
from .exact_prompt import PromptTooShort, fit_prompt, salted
from .prompts import PromptSource, synthetic_text
from .salts import new_decimal_salt
from .state import RunObserver, TargetRun
from .trace_replay import Replay
from .workload_prompts import workload_generation

BLOCK_SEED = 1_000_003  # block texts' seeds, apart from the filler's (seed 0 on)


class _Blocks:
    """Block texts and the token counts of prefixes, each asked of the server once."""

    def __init__(self, tokenizer: Tokenizer, block_tokens: int):
        self.tokenizer, self.block_tokens = tokenizer, block_tokens
        self.texts: dict[int, str] = {}
        self.counts: dict[tuple[int, ...], int] = {}

    async def text(self, h: int) -> str:
        if h not in self.texts:
            n = max(1, self.block_tokens - 1)
            pieces = await self.tokenizer.pieces(synthetic_text(n * 8, BLOCK_SEED + h))
            self.texts[h] = b"".join(pieces[:n]).decode("utf-8", "ignore") + "\n"
        return self.texts[h]

    async def tokens(self, blocks: tuple[int, ...]) -> int:
        """Tokens of the blocks' texts together, without the BOS token."""
        if blocks not in self.counts:
            text = "".join([await self.text(h) for h in blocks])
            self.counts[blocks] = await self.tokenizer.count(text) - await self.tokenizer.specials()
        return self.counts[blocks]


async def _prompt(blocks: _Blocks, hash_ids: tuple[int, ...], length: int, salt_tokens: int,
                  filler, template_tokens: int = 0) -> tuple[str, str]:
    """(prefix, body) of one request: its leading blocks and the filler after the salt. With a chat
    template (`template_tokens`, --api chat, responses, messages) its tokens are inside `length`, as
    a sweep's --prompt-tokens counts them, so the server's prompt_n is the trace's length."""
    room = length - template_tokens
    k = min(len(hash_ids), max(0, (room - salt_tokens - 1) // blocks.block_tokens))
    while k and await blocks.tokens(hash_ids[:k]) + salt_tokens + 1 > room:
        k -= 1
    prefix_tokens = await blocks.tokens(hash_ids[:k]) if k else 0
    prefix = "".join([await blocks.text(h) for h in hash_ids[:k]])
    fit = await fit_prompt(blocks.tokenizer, filler, length - prefix_tokens, template_tokens=template_tokens)
    return prefix, fit.body


async def trace_generation(config: SweepConfig, t: TargetRun, obs: RunObserver,
                           replay: Replay) -> tuple[GenerationParams, EngineOptions] | None:
    """One body per trace request for this target, shared blocks first; without /tokenize (or a
    trace without hash ids) the prompts are those of drawn lengths (salt first)."""
    if not any(replay.hash_ids):
        return await workload_generation(config, t, obs, replay.shapes, floor=True)
    prefixes: list[str] = []
    bodies: list[str] = []
    try:
        async with server_tokenizer(t.target.probe_url, headers=config.auth_headers(), timeout_s=config.timeout_s,
                                    insecure=config.insecure) as tokenizer:
            specials = await tokenizer.specials()
            # "[<salt>] x" without the BOS: the salt's room, one token of filler to spare.
            salt_tokens = await tokenizer.count(salted(new_decimal_salt(), "x")) - specials
            template = await tokenizer.template_overhead() if config.api in CHAT_TEMPLATE_APIS else 0
            blocks = _Blocks(tokenizer, replay.block_tokens)
            # The fewest tokens a prompt can be: the BOS, the chat template's own tokens and
            # "[<salt>] x". A shorter trace length is raised to it, counted and named (never silently).
            least = specials + template + salt_tokens
            floored = 0
            for shape, hash_ids in zip(replay.shapes, replay.hash_ids):
                assert shape.prompt_tokens is not None
                floored += shape.prompt_tokens < least
                prefix, body = await _prompt(blocks, hash_ids, max(least, shape.prompt_tokens), salt_tokens,
                                             lambda m: synthetic_text(m, 0), template)
                prefixes.append(prefix)
                bodies.append(body)
    except TokenizeUnavailable:
        obs.message(f"{t.label}: the server has no /tokenize: the trace's blocks are not shared, prompts estimated")
        return await workload_generation(config, t, obs, replay.shapes, floor=True)
    except PromptTooShort as exc:
        t.error = f"{t.target.display}: a replayed prompt is too short: {exc}; raise --scale-lengths"
        return None
    t.lengths_floored = (floored, len(replay.shapes), least) if floored else None
    generation = replace(config.generation, prompt=bodies[0], prompts=tuple(bodies), prefixes=tuple(prefixes),
                         n_predicts=tuple(s.n_predict for s in replay.shapes),
                         n_predict=max(s.n_predict for s in replay.shapes))
    return generation, EngineOptions(salt=new_decimal_salt)


@dataclass(frozen=True, slots=True)
class TraceSource:
    """A request source (run/request_source.py): one body per trace request, shared blocks first,
    `trace_generation`; the level cycles through the trace's shapes."""

    replay: Replay
    name = "trace"

    @classmethod
    def from_config(cls, config: SweepConfig, prompt_tokens: int | None,
                    prompt_source: PromptSource) -> TraceSource | None:
        return None if config.replay is None else cls(config.replay)

    def describe(self) -> str:
        shared = f", shared blocks of {self.replay.block_tokens} tokens first" if any(self.replay.hash_ids) else ""
        return f"a trace of {len(self.replay.shapes):,} requests, each of its own lengths{shared}"

    async def build(self, config: SweepConfig, t: TargetRun, obs: RunObserver, options: EngineOptions
                    ) -> tuple[GenerationParams, EngineOptions, tuple[RequestShape, ...]] | None:
        shaped = await trace_generation(config, t, obs, self.replay)
        if shaped is None:
            return None
        generation, shaped_options = shaped
        return generation, replace(options, salt=shaped_options.salt), self.replay.shapes
