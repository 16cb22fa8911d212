"""What prefill, depth and soak share: a run of targets, each a list of steps, and their setup.

A step is one prompt length (prefill) or one context depth (depth) on one target: the `LevelRun`
of its requests, how its prompt was built, or why it was skipped. A soak target has one level and
no steps. The `ModeRun` is owned by the caller, so whatever happens (Ctrl-C, a dead server) every
record gathered so far can still be written.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from .client.backends import make_backend
from .core.clock import now_ns
from .config import SweepConfig
from .analysis.depth import skip_reason as context_skip_reason
from .engine import EngineOptions, new_decimal_salt, run_level
from .run.exact_prompt import FittedPrompt, fit_prompts
from .prompts import PromptSource
from .core.records import LevelRun
from .sweep import SweepObserver, TargetRun, _prepare, resolve_labels
from .client.transport import Transport
from .client.registry import make_transport


@dataclass(slots=True)
class Step:
    size: int  # prompt tokens asked for: the prefill length, or the depth
    level: LevelRun | None = None  # None: skipped
    note: str | None = None  # how the prompt was built when it is not exactly `size` tokens
    skipped: str | None = None  # why no request was sent


@dataclass(slots=True)
class ModeTarget(TargetRun):
    steps: list[Step] = field(default_factory=list)


@dataclass(slots=True)
class ModeRun:
    kind: str  # "prefill", "depth" or "soak"
    base: SweepConfig  # targets, API, generation settings, timeouts
    settings: dict[str, Any]  # the mode's own settings, as run.json's config records them
    targets: list[ModeTarget] = field(default_factory=list)
    interrupted: bool = False
    start_ns: int = field(default_factory=now_ns)
    end_ns: int | None = None

    @property
    def complete(self) -> bool:
        return not self.interrupted and all(t.error is None for t in self.targets) and all(
            lv.finished and lv.stopped_reason is None for t in self.targets for lv in t.levels)


async def prepare_targets(run: ModeRun, obs: SweepObserver) -> list[ModeTarget]:
    """Wait for each target, ask it about itself, label it; return the reachable ones."""
    run.targets = [ModeTarget(target=t, label=t.label or t.hostport) for t in run.base.targets]
    await asyncio.gather(*(_prepare(run.base, t, obs) for t in run.targets))
    resolve_labels(run.targets)  # type: ignore[arg-type]
    for t in run.targets:
        if t.error:
            obs.message(f"skipping {t.error}")
    return [t for t in run.targets if t.error is None]


def slot_context(t: TargetRun) -> int | None:
    """The server's per-slot context (/props default_generation_settings.n_ctx), or None if unknown."""
    props = t.info.props if t.info else None
    n_ctx = props.get("n_ctx") if props else None
    return n_ctx if isinstance(n_ctx, int) and n_ctx > 0 else None


class StepObserver(SweepObserver):
    def step_started(self, target: ModeTarget, step: Step) -> None: ...

    def step_done(self, run: ModeRun, target: ModeTarget, step: Step) -> None: ...


SALT_ONLY_NOTE = "the shortest prompt there is: the uuid salt alone"
EXACT = EngineOptions(salt=new_decimal_salt)  # salts of a fixed token count, for exact prompt lengths


async def run_steps(run: ModeRun, obs: StepObserver, source: PromptSource, sizes: tuple[int, ...], *,
                    n_predict: int, repeat: int, salt_only_below: bool,
                    transport_factory: Callable[[], Transport] | None = None) -> None:
    """For each reachable target in turn, each size in turn: `repeat` requests one after another
    with a prompt of exactly `size` tokens for that target and `n_predict` tokens to generate.

    A size the server's per-slot context cannot hold is skipped with a reason. A size too small to
    hold the salt is skipped too, or, with `salt_only_below` (depth 0), sent as the salt alone.
    """
    config = run.base
    live = await prepare_targets(run, obs)
    for t in live:
        to_cut = [n for n in sizes if n > 0]
        obs.message(f"{t.label}: cutting prompts of {', '.join(f'{n:,}' for n in to_cut)} tokens with its tokenizer")
        fitted = await fit_prompts(t.target.url, source.text, to_cut, api=config.api, headers=config.auth_headers(),
                                   timeout_s=config.timeout_s, insecure=config.insecure)
        n_ctx = slot_context(t)
        transport = (transport_factory() if transport_factory is not None
                     else make_transport(config.transport, t.target.url, obs.message))
        await transport.open(t.target.url, 1, config.timeout_s, config.auth_headers(), insecure=config.insecure,
                             close_streams=t.info.closes_streams if t.info else True)
        try:
            warm = config.warmup
            for size in sizes:
                step = Step(size)
                t.steps.append(step)
                fit = fitted.get(size)
                if isinstance(fit, FittedPrompt):
                    body, step.note = fit.body, fit.note()
                elif salt_only_below:
                    body, step.note = "", SALT_ONLY_NOTE
                else:
                    step.skipped = f"skipped: {fit}"
                    obs.step_done(run, t, step)
                    continue
                step.skipped = context_skip_reason(size, n_predict, n_ctx)
                if step.skipped:
                    obs.step_done(run, t, step)
                    continue
                backend = make_backend(config.api, replace(config.generation, prompt=body, prompts=(),
                                                           n_predict=n_predict), t.model)
                if warm > 0:  # unrecorded, with the first prompt that fits
                    warm_level = LevelRun(target=t.label, concurrency=1)
                    await run_level(warm_level, transport, backend, requests=warm, duration_s=None,
                                    options=EXACT)
                    warm = 0
                    if warm_level.stopped_reason:
                        t.error = f"{t.target.url}: warm-up failed, {warm_level.stopped_reason}"
                        break
                step.level = LevelRun(target=t.label, concurrency=1, prompt_tokens=size)
                t.levels.append(step.level)
                obs.step_started(t, step)
                await run_level(step.level, transport, backend, requests=repeat, duration_s=None, observer=obs,
                                options=EXACT)
                obs.level_done(run, t, step.level)  # type: ignore[arg-type]
                obs.step_done(run, t, step)
                if step.level.stopped_reason:
                    t.error = f"{t.target.url}: {step.level.stopped_reason} at {size:,} tokens"
                    break
        finally:
            await transport.close()

