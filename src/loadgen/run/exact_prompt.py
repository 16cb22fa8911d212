"""Prompts of an exact token count for one server, measured with its own tokenizer.

A request's prompt is "[<salt>] " + body, so the count N includes the salt. The salt is 16 random
decimal digits (run/salts.py): tokenizers split digit runs by fixed rules, so every salt costs the
same number of tokens and one body fits every request.

With llama-server's `POST /tokenize` (`add_special` counts the BOS token the server adds):
  1. tokenize "[<salt>] " + source text with pieces, keep the first N - specials pieces;
  2. the body is those pieces' text after the salt prefix;
  3. re-tokenize "[<salt>] " + body and move the cut a piece at a time until the count is N
     (a cut can merge two pieces into one, or split one);
  4. check the count with a few other salts, and say so when the tokenizer makes them differ.
With `--api chat` the server wraps the prompt in its chat template: the template's tokens are
measured once with `POST /apply-template` and the body is cut that much shorter.
Without /tokenize (an OpenAI-compatible server), the body is cut at an estimated
`WORDS_PER_TOKEN` and the caller warns that the lengths are estimates; the server's `prompt_n` is
recorded either way. The server's tokenizer is client/tokenize.py.

`ExactLengthSource` is the run's request source for a fixed --prompt-tokens (run/request_source.py):
one body per prompt text (`fit_exact_prompts`), the same length for every request.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from ..client.backends import CHAT_TEMPLATE_APIS, GenerationParams
from ..client.tokenize import Tokenizer, TokenizeUnavailable, server_tokenizer
from ..core.workload import RequestShape
from .config import SweepConfig
from .engine import EngineOptions
from .prompts import PromptSource
from .salts import new_decimal_salt
from .state import RunObserver, TargetRun

WORDS_PER_TOKEN = 0.75  # English prose on the usual BPE vocabularies
SALT_TOKENS_ESTIMATE = 12  # "[<16 digits>] " without a tokenizer to ask (8 to 18 on usual ones)
SALT_CHECKS = 3  # other salts the fitted length is confirmed with
MAX_ADJUST = 8  # re-tokenize rounds before settling for the closest cut


def salted(salt: str, body: str) -> str:
    """Exactly what the backends send as the prompt text."""
    return f"[{salt}] {body}"


@dataclass(frozen=True, slots=True)
class FittedPrompt:
    body: str  # the text after "[<salt>] "
    target_tokens: int
    measured_tokens: int | None  # the server's count with a sample salt; None: estimated
    salt_spread: int = 0  # max - min count over several salts (0: every salt fits exactly)
    method: str = "tokenize"  # "tokenize" or "estimate"
    template_tokens: int = 0  # added by the chat template (--api chat), inside the count

    @property
    def exact(self) -> bool:
        return self.measured_tokens == self.target_tokens and self.salt_spread == 0

    def note(self) -> str | None:
        """A warning for the user when the prompt is not exactly N tokens for every salt, else None."""
        if self.method == "estimate":
            return (f"the server has no /tokenize: a {self.target_tokens}-token prompt is estimated at "
                    f"{WORDS_PER_TOKEN} words per token; compare prompt_n in the results")
        if self.measured_tokens != self.target_tokens:
            return (f"no cut of the text gives exactly {self.target_tokens} tokens on this tokenizer; "
                    f"using {self.measured_tokens}")
        if self.salt_spread:
            return (f"this tokenizer splits the salt into a varying number of tokens: "
                    f"prompt_n may differ from {self.target_tokens} by up to {self.salt_spread}")
        return None


def too_short(wanted: int, salt_tokens: int, template_tokens: int) -> str:
    """Why `wanted` tokens cannot hold a prompt, blaming what takes most of them: the chat template
    (its system prompt and role markers) or the salt."""
    least = salt_tokens + template_tokens + 1
    if template_tokens > salt_tokens:
        return (f"{wanted} tokens are too few: the chat template's system prompt takes {template_tokens}; "
                f"ask for {least}+")
    extra = f", the chat template {template_tokens}" if template_tokens else ""
    return f"{wanted} tokens are too few: the salt takes {salt_tokens}{extra}; ask for at least {least}"


class PromptTooShort(ValueError):
    """`least`: the fewest tokens that would have fit, when known (0: not known)."""

    def __init__(self, message: str, least: int = 0):
        super().__init__(message)
        self.least = least


async def fit_prompt(tokenizer: Tokenizer, source: Callable[[int], str], n_tokens: int,
                     salt: Callable[[], str] = new_decimal_salt, template_tokens: int = 0) -> FittedPrompt:
    """A body such that "[<salt>] " + body is `n_tokens` tokens on this server (`template_tokens`
    of them being the chat template's).

    `source(min_chars)` returns at least that many characters of text to cut the body from.
    Raises PromptTooShort when n_tokens cannot even hold the salt and one token of text.
    """
    wanted = n_tokens
    n_tokens -= template_tokens
    specials = await tokenizer.specials()
    prefix = salted(salt(), "")
    prefix_pieces = len(await tokenizer.pieces(prefix.rstrip(" ")))
    need = n_tokens - specials  # pieces of "[salt] body"
    if need <= prefix_pieces:
        raise PromptTooShort(too_short(wanted, prefix_pieces + specials, template_tokens),
                             least=prefix_pieces + specials + template_tokens + 1)
    chars = max(64, (need - prefix_pieces) * 6)
    while True:
        pieces = await tokenizer.pieces(prefix + source(chars))
        if len(pieces) >= need + MAX_ADJUST:
            break
        chars *= 2
    prefix_bytes = prefix.encode("utf-8")

    def body_of(k: int) -> str:
        text = b"".join(pieces[:k])
        return text[len(prefix_bytes):].decode("utf-8", "ignore") if text.startswith(prefix_bytes) else ""

    cut, best = need, None
    tried: dict[int, int] = {}
    for _ in range(MAX_ADJUST):
        body = body_of(cut)
        got = await tokenizer.count(prefix + body)
        tried[cut] = got
        if best is None or abs(got - n_tokens) < abs(best[1] - n_tokens):
            best = (body, got)
        if got == n_tokens:
            break
        step = n_tokens - got  # usually ±1; a cut that re-tokenizes differently can move more
        cut = cut + step if cut + step not in tried else cut + (1 if step > 0 else -1)
        if cut in tried or cut <= prefix_pieces or cut > len(pieces):
            break
    assert best is not None
    body, got = best
    counts = [got] + [await tokenizer.count(salted(salt(), body)) for _ in range(SALT_CHECKS)]
    return FittedPrompt(body=body, target_tokens=wanted, measured_tokens=got + template_tokens,
                        salt_spread=max(counts) - min(counts), template_tokens=template_tokens)


def estimate_prompt(source: Callable[[int], str], n_tokens: int) -> FittedPrompt:
    """The fallback without a tokenizer: cut the text at an estimated word count."""
    words_wanted = max(1, round((n_tokens - SALT_TOKENS_ESTIMATE) * WORDS_PER_TOKEN))
    words = source(words_wanted * 8).split()
    return FittedPrompt(body=" ".join(words[:words_wanted]), target_tokens=n_tokens, measured_tokens=None,
                        method="estimate")


async def fit_prompts(base_url: str, source: Callable[[int], str], lengths: list[int], *, api: str = "llamacpp",
                      headers: Mapping[str, str] | None = None, timeout_s: float = 120,
                      insecure: bool = False) -> dict[int, FittedPrompt | PromptTooShort]:
    """Per length, a fitted prompt for the server at base_url (estimated when it has no /tokenize),
    or the PromptTooShort error of a length that cannot hold the salt."""
    out: dict[int, FittedPrompt | PromptTooShort] = {}
    async with server_tokenizer(base_url, headers=headers, timeout_s=timeout_s, insecure=insecure) as tokenizer:
        template: int | None = 0
        if api in CHAT_TEMPLATE_APIS:
            try:
                template = await tokenizer.template_overhead()
            except TokenizeUnavailable:
                template = None
        for n in lengths:
            try:
                if template is None:
                    raise TokenizeUnavailable("the chat template cannot be measured")
                out[n] = await fit_prompt(tokenizer, source, n, template_tokens=template)
            except TokenizeUnavailable:
                out[n] = estimate_prompt(source, n)
            except PromptTooShort as exc:
                out[n] = exc
    return out


async def exact_prompts(base_url: str, source: PromptSource, n_tokens: int, *, api: str = "llamacpp",
                        headers: Mapping[str, str] | None = None, timeout_s: float = 120,
                        insecure: bool = False) -> tuple[tuple[str, ...], str | None]:
    """Prompt bodies of exactly n_tokens for this server (one per source text, up to a cap), and a
    note for the user when they are not exact. Raises PromptTooShort."""
    bodies: list[str] = []
    notes: list[str] = []
    for start in range(source.variants()):
        fit = (await fit_prompts(base_url, functools.partial(source.text, start=start), [n_tokens], api=api,
                                 headers=headers, timeout_s=timeout_s, insecure=insecure))[n_tokens]
        if not isinstance(fit, FittedPrompt):
            raise fit
        bodies.append(fit.body)
        if (note := fit.note()) and note not in notes:
            notes.append(note)
    return tuple(bodies), "; ".join(notes) or None


async def fit_exact_prompts(config: SweepConfig, t: TargetRun, obs: RunObserver, source: PromptSource,
                            n_tokens: int) -> tuple[str, ...] | None:
    """--prompt-tokens: prompt bodies of exactly n_tokens for this target (a note for the user when
    they are estimates); None, and the target's error set, when that length cannot be built."""
    try:
        bodies, note = await exact_prompts(t.target.probe_url, source, n_tokens, api=config.api,
                                           headers=config.auth_headers(), timeout_s=config.timeout_s,
                                           insecure=config.insecure)
    except PromptTooShort as exc:
        t.error = f"{t.target.display}: --prompt-tokens: {exc}"
        return None
    if note:
        obs.message(f"{t.label}: {note}")
    return bodies


@dataclass(frozen=True, slots=True)
class ExactLengthSource:
    """A request source (run/request_source.py): every prompt exactly `n_tokens` on the target's
    tokenizer, cut from `texts` (`fit_exact_prompts`), with salts of a fixed token count."""

    texts: PromptSource
    n_tokens: int
    name = "exact-length"

    @classmethod
    def from_config(cls, config: SweepConfig, prompt_tokens: int | None,
                    prompt_source: PromptSource) -> ExactLengthSource | None:
        return cls(prompt_source, prompt_tokens) if prompt_tokens else None

    def describe(self) -> str:
        cut = "synthetic prose" if self.texts.synthetic else f"{self.texts.variants():,} of the run's texts"
        return f"prompts of exactly {self.n_tokens:,} tokens, cut from {cut}"

    async def build(self, config: SweepConfig, t: TargetRun, obs: RunObserver, options: EngineOptions
                    ) -> tuple[GenerationParams, EngineOptions, tuple[RequestShape, ...]] | None:
        bodies = await fit_exact_prompts(config, t, obs, self.texts, self.n_tokens)
        if bodies is None:
            return None
        generation = replace(config.generation, prompt=bodies[0], prompts=bodies if len(bodies) > 1 else ())
        return generation, replace(options, salt=new_decimal_salt), ()
