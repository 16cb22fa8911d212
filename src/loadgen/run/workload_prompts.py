"""A workload's request bodies for one target: each drawn shape's prompt cut to its exact length
with that server's own tokenizer, and its own n_predict.

The shapes (core/workload.py) are the same for every target; the prompts are cut per target, so
two servers with different tokenizers both get prompts of exactly the drawn lengths. A length
counts as run/exact_prompt.py counts it: the salt, the BOS token and (--api chat) the chat
template are inside it, so a request's `prompt_n` is its drawn length, with no overhead on top.
Distinct lengths are fitted once each; the prompt texts rotate over the prompt source's variants
(a dataset's texts) by length.

`DrawnLengthSource` is the run's request source when lengths are drawn (run/request_source.py), and
each request class's (run/classes.py).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from ..analysis.context import context_overflow
from ..client.backends import GenerationParams
from ..core.errors import ConfigError
from ..core.workload import RequestShape, Workload
from .config import SweepConfig
from .engine import DEFAULT_OPTIONS, EngineOptions
from .exact_prompt import FittedPrompt, fit_prompts
from .prompts import PromptSource
from .salts import new_decimal_salt
from .state import RunObserver, TargetRun, slot_context


def shape_generation(generation: GenerationParams, shapes: tuple[RequestShape, ...],
                     bodies: dict[int, str] | None) -> GenerationParams:
    """`generation` with one body per shape: shape i's prompt (bodies[length], or the run's prompt
    texts in turn when the workload does not cut prompts) and its n_predict."""
    texts = generation.prompt_list
    prompts = tuple(bodies[s.prompt_tokens] if bodies is not None and s.prompt_tokens is not None
                    else texts[i % len(texts)] for i, s in enumerate(shapes))
    return replace(generation, prompt=prompts[0], prompts=prompts, n_predicts=tuple(s.n_predict for s in shapes),
                   n_predict=max(s.n_predict for s in shapes))


async def fit_lengths(config: SweepConfig, t: TargetRun, obs: RunObserver,
                      lengths: list[int], what: str = "--prompt-tokens", floor: bool = False
                      ) -> tuple[dict[int, str], int] | None:
    """({length: body} cut for this target, the floor in tokens or 0); None, and the target's error
    set, when a length cannot hold the salt. With `floor` (a replayed trace, whose lengths the user
    did not choose one by one) such a length gets the body of the shortest length that can, and that
    length is returned as the floor. One note for the user when some lengths are estimates or not exact."""
    source = config.prompt_source or PromptSource()
    variants = source.variants()
    by_variant: dict[int, list[int]] = {}
    for k, n in enumerate(sorted(set(lengths))):
        by_variant.setdefault(k % variants, []).append(n)
    bodies: dict[int, str] = {}
    notes: list[str] = []
    least = 0
    for start, group in by_variant.items():
        fits = await fit_prompts(t.target.probe_url, functools.partial(source.text, start=start), group, api=config.api,
                                 headers=config.auth_headers(), timeout_s=config.timeout_s, insecure=config.insecure)
        for n, fit in fits.items():
            if floor and not isinstance(fit, FittedPrompt) and fit.least:
                least = fit.least
                fit = (await fit_prompts(t.target.probe_url, functools.partial(source.text, start=start), [least],
                                         api=config.api, headers=config.auth_headers(), timeout_s=config.timeout_s,
                                         insecure=config.insecure))[least]
            if not isinstance(fit, FittedPrompt):
                t.error = (f"{t.target.display}: {what} draws {n}: {fit}; raise the distribution's "
                           "min= (or its lowest length)")
                return None
            bodies[n] = fit.body
            if (note := fit.note()) is not None:
                notes.append(note)
    if notes:
        obs.message(f"{t.label}: {len(notes)} of {len(bodies)} prompt lengths are not exact, e.g.: {notes[0]}")
    return bodies, least


async def workload_generation(config: SweepConfig, t: TargetRun, obs: RunObserver,
                              shapes: tuple[RequestShape, ...], what: str = "--prompt-tokens",
                              floor: bool = False) -> tuple[GenerationParams, EngineOptions] | None:
    """The run's generation with one body per shape for this target, and the engine options its
    salts need (fixed-size decimal salts when prompts are cut); None when the target cannot take it
    (its error names the lengths' source, `what`). With `floor`, a length too short for the salt is
    raised to the shortest that holds it, and the requests so changed counted (`t.lengths_floored`)."""
    lengths = [s.prompt_tokens for s in shapes if s.prompt_tokens is not None]
    if not lengths:
        return shape_generation(config.generation, shapes, None), DEFAULT_OPTIONS
    fitted = await fit_lengths(config, t, obs, lengths, what, floor)
    if fitted is None:
        return None
    bodies, least = fitted
    floored = sum(n < least for n in lengths)
    t.lengths_floored = (floored, len(lengths), least) if floored else None
    return shape_generation(config.generation, shapes, bodies), EngineOptions(salt=new_decimal_salt)


def refuse_shapes_beyond_context(targets: list[TargetRun], shapes: tuple[RequestShape, ...]) -> None:
    """Before the first level: a drawn prompt and its answer that a target's per-slot context cannot
    hold would fail (or be cut) on every pass of its shape, so the run is refused (ConfigError)
    naming the largest such shape, as a fixed --prompt-tokens is (run/target_setup.py)."""
    cut = [(s.prompt_tokens, s.n_predict) for s in shapes if s.prompt_tokens is not None]
    if not cut:
        return
    prompt_tokens, n_predict = max(cut, key=lambda c: c[0] + c[1])
    for t in targets:
        problem = context_overflow(prompt_tokens, n_predict, slot_context(t))
        if problem:
            raise ConfigError(f"{t.label} ({t.target.display}) cannot take the workload's largest request: {problem}; "
                              "lower the largest lengths (a distribution's max=, replay's --max-prompt-tokens) or restart "
                              "the server with a larger -c")


@dataclass(frozen=True, slots=True)
class DrawnLengthSource:
    """A request source (run/request_source.py): the workload's shapes, drawn when built, one body per
    shape, `workload_generation`. `what` names the lengths in an error."""

    workload: Workload
    what: str = "--prompt-tokens"
    name = "drawn-lengths"

    @classmethod
    def from_config(cls, config: SweepConfig, prompt_tokens: int | None,
                    prompt_source: PromptSource) -> DrawnLengthSource | None:
        return None if config.workload is None else cls(config.workload)

    def describe(self) -> str:
        prompts = "as given" if self.workload.prompt_tokens is None else self.workload.prompt_tokens.text
        return (f"{self.workload.shapes:,} request shapes drawn (seed {self.workload.seed}): prompt_tokens "
                f"{prompts}, n_predict {self.workload.n_predict.text}")

    async def build(self, config: SweepConfig, t: TargetRun, obs: RunObserver, options: EngineOptions
                    ) -> tuple[GenerationParams, EngineOptions, tuple[RequestShape, ...]] | None:
        shapes = self.workload.draw()
        shaped = await workload_generation(config, t, obs, shapes, self.what)
        if shaped is None:
            return None
        generation, shaped_options = shaped
        return generation, replace(options, salt=shaped_options.salt), shapes
