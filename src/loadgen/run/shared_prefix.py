"""A shared-prefix run's prompts for one target: groups of requests sharing a system prompt.

Group g's prefix is a level salt (LEVEL_SALT_DIGITS random decimal digits and a newline) and
synthetic prose seeded by g, cut on this server's tokenizer to exactly `prefix_tokens` tokens (BOS
not counted) and ended with a newline, so the salt after it cannot merge with its last token. Each
request's prompt is then

    "<level salt>\n" + prose(g) + "[<salt>] " + body(g)

The level salt is drawn anew for every level (`new_level_salt`): a run of the same digit count
tokenizes to the same count, so the prefix stays exact, and no level starts warm from what an
earlier level or run left in the server's cache; within a level, each group's requests share their
group's.

with body(g) cut (run/exact_prompt.fit_prompt) so the salted part, with the BOS token, is
`total − prefix_tokens` tokens: the whole prompt is exactly `total` tokens. Request i is of group
i mod groups (the backends' prompt index), so a group's requests share exactly BOS + prefix on the
wire and nothing after. The bodies ask for `cache_prompt: true` unless the mode's cache is off.

`SharedPrefixSource` is the run's request source when a shared-prefix mode is set (run/request_source.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from ..client.backends import CHAT_TEMPLATE_APIS, GenerationParams
from ..client.tokenize import Tokenizer, TokenizeUnavailable, server_tokenizer
from ..core.cache_mode import SharedPrefix
from ..core.errors import ConfigError
from ..core.workload import RequestShape
from .config import SweepConfig
from .engine import EngineOptions
from .exact_prompt import PromptTooShort, fit_prompt
from .prompts import PromptSource, synthetic_text
from .salts import new_decimal_salt
from .state import RunObserver, TargetRun

PREFIX_SEED = 2_000_003  # the prefixes' seeds, apart from the bodies' (seed g) and a trace's blocks
LEVEL_SALT_DIGITS = 8  # 10^8 draws: two levels or runs sharing one is not worth a longer prefix


def _level_salt() -> str:
    return "".join(str(b % 10) for b in os.urandom(LEVEL_SALT_DIGITS))


def new_level_salt(generation: GenerationParams) -> GenerationParams:
    """The same bodies with a new level salt at the head of every group's prefix (one per group, so
    two groups share no more than BOS)."""
    return replace(generation, prefixes=tuple(_level_salt() + p[LEVEL_SALT_DIGITS:] for p in generation.prefixes))


async def exact_prefix(tokenizer: Tokenizer, n_tokens: int, seed: int, lead: str = "") -> str:
    """Text of exactly `n_tokens` tokens on this tokenizer (without BOS), `lead` then prose, ending
    with a newline. Raises PromptTooShort when the tokenizer cannot give that count (it never merged to it)."""
    specials = await tokenizer.specials()
    pieces = await tokenizer.pieces(lead + synthetic_text(n_tokens * 8 + 64, PREFIX_SEED + seed))
    take = max(0, n_tokens - 1)
    for _ in range(8):  # the newline may merge with the last piece: move the cut until it counts
        text = b"".join(pieces[:take]).decode("utf-8", "ignore") + "\n"
        count = await tokenizer.count(text) - specials
        if count == n_tokens:
            return text
        take += n_tokens - count
        if take < 0:
            break
    raise PromptTooShort(f"no text of exactly {n_tokens} tokens found for the shared prefix")


async def _own_part(tokenizer: Tokenizer, t: TargetRun, mode: SharedPrefix, group: int, template: int) -> str:
    """Group `group`'s body after its prefix: the salt and its own text. A --prompt-tokens too short
    to hold them is bad input, refused before any request (ConfigError) with the value that fits."""
    try:
        fit = await fit_prompt(tokenizer, lambda m: synthetic_text(m, group),
                               mode.total_tokens - mode.prefix_tokens, template_tokens=template)
    except PromptTooShort as exc:
        if not exc.least:
            raise
        raise ConfigError(f"{t.label} ({t.target.display}): --prompt-tokens {mode.total_tokens} leaves "
                          f"{mode.total_tokens - mode.prefix_tokens} tokens after the {mode.prefix_tokens}-token "
                          f"prefix, and the salt and the request's own text need {exc.least}: give --prompt-tokens "
                          f"{mode.prefix_tokens + exc.least} or more") from None
    return fit.body


async def shared_prefix_generation(config: SweepConfig, t: TargetRun, obs: RunObserver,
                                   mode: SharedPrefix) -> tuple[GenerationParams, EngineOptions] | None:
    """One body per group for this target (prefix, salt, own text), exact in tokens; None, and the
    target's error set, when the server has no /tokenize or the lengths cannot be built."""
    prefixes, bodies = [], []
    try:
        async with server_tokenizer(t.target.probe_url, headers=config.auth_headers(), timeout_s=config.timeout_s,
                                    insecure=config.insecure) as tokenizer:
            # A chat template (--api chat, responses, messages): its tokens are inside the whole
            # prompt's count, as a sweep's.
            template = await tokenizer.template_overhead() if config.api in CHAT_TEMPLATE_APIS else 0
            for g in range(mode.groups):
                prefixes.append(await exact_prefix(tokenizer, mode.prefix_tokens, g, _level_salt() + "\n"))
                bodies.append(await _own_part(tokenizer, t, mode, g, template))
    except TokenizeUnavailable:
        t.error = f"{t.target.display}: a shared prefix is cut with the server's /tokenize, which it does not answer"
        return None
    except PromptTooShort as exc:
        t.error = (f"{t.target.display}: --prompt-tokens {mode.total_tokens} leaves no room after the "
                   f"{mode.prefix_tokens}-token prefix: {exc}")
        return None
    obs.message(f"{t.label}: {mode.groups} shared prefix(es) of {mode.prefix_tokens} tokens, prompts of "
                f"{mode.total_tokens} tokens, cache_prompt {'on' if mode.cache_prompt else 'off'}")
    generation = replace(config.generation, prompt=bodies[0], prompts=tuple(bodies), prefixes=tuple(prefixes),
                         cache_prompt=mode.cache_prompt)
    return generation, EngineOptions(salt=new_decimal_salt)


@dataclass(frozen=True, slots=True)
class SharedPrefixSource:
    """A request source (run/request_source.py): groups sharing an exact prefix, `shared_prefix_generation`."""

    mode: SharedPrefix
    name = "shared-prefix"

    @classmethod
    def from_config(cls, config: SweepConfig, prompt_tokens: int | None,
                    prompt_source: PromptSource) -> SharedPrefixSource | None:
        return None if config.shared_prefix is None else cls(config.shared_prefix)

    def describe(self) -> str:
        return (f"{self.mode.groups} shared prefix(es) of {self.mode.prefix_tokens} tokens, prompts of "
                f"{self.mode.total_tokens} tokens, cache_prompt {'on' if self.mode.cache_prompt else 'off'}")

    async def build(self, config: SweepConfig, t: TargetRun, obs: RunObserver, options: EngineOptions
                    ) -> tuple[GenerationParams, EngineOptions, tuple[RequestShape, ...]] | None:
        shared = await shared_prefix_generation(config, t, obs, self.mode)
        if shared is None:
            return None
        generation, shared_options = shared
        return generation, replace(options, salt=shared_options.salt), ()
