"""Prefill and depth: for each target, a step per prompt length (prefill) or context depth (depth).

A step is one size on one target: the `LevelRun` of its requests, how its prompt was built, or why
it was skipped (state.py's `Step`). The per-target setup is target_setup.py's, the figures
analysis/prefill.py's and analysis/depth.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..analysis.depth import skip_reason as context_skip_reason
from ..client.backends import make_backend
from ..core.records import LevelRun
from .engine import EngineOptions
from .exact_prompt import FittedPrompt, PromptTooShort, fit_prompts
from .level_runner import LevelRunner, TargetLoad
from .machine_sampling import sampled_runner
from .prompts import PromptSource
from .recording import stream_level
from .salts import new_decimal_salt
from .state import Run, Step, StepObserver, slot_context
from .target_setup import TransportFactory, prepare_targets, target_load

SALT_ONLY_NOTE = "the shortest prompt there is: the salt alone"
EXACT = EngineOptions(salt=new_decimal_salt)  # salts of a fixed token count, for exact prompt lengths


async def run_steps(run: Run, obs: StepObserver, source: PromptSource, sizes: tuple[int, ...], *,
                    n_predict: int, repeat: int, salt_only_below: bool, runner: LevelRunner,
                    transport_factory: TransportFactory | None = None) -> None:
    """For each reachable target in turn, each size in turn: `repeat` requests one after another
    with a prompt of exactly `size` tokens for that target and `n_predict` tokens to generate, sent
    by `runner` (run/level_runner.py).

    A size the server's per-slot context cannot hold is skipped with a reason. A size too small to
    hold the salt is skipped too, or, with `salt_only_below` (depth 0), sent as the salt alone. The
    target's warm-up (target_setup.py's skeleton) sends the first prompt that fits. The machine is
    read before the first step and sampled through each, as a sweep's levels are.
    """
    # A step is a closed loop of one, `repeat` requests long.
    config = replace(run.config, requests_per_level=repeat, duration_s=None)
    live = await prepare_targets(run, obs)
    runner = await sampled_runner(run, live, runner, obs)  # the fingerprint, and each step's machine samples
    for t in live:
        to_cut = [n for n in sizes if n > 0]
        obs.message(f"{t.label}: cutting prompts of {', '.join(f'{n:,}' for n in to_cut)} tokens with its tokenizer")
        fitted = await fit_prompts(t.target.probe_url, source.text, to_cut, api=config.api,
                                   headers=config.auth_headers(),
                                   timeout_s=config.timeout_s, insecure=config.insecure)
        prompts = {size: _step_prompt(size, fitted.get(size), n_predict, salt_only_below, slot_context(t))
                   for size in sizes}
        first = next((p.body for p in prompts.values() if p.body is not None), None)
        target_config = config if first is not None else replace(config, warmup=0)  # nothing to send
        generation = replace(config.generation, prompt=config.generation.prompt if first is None else first,
                             prompts=(), n_predict=n_predict)
        async with target_load(replace(target_config, generation=generation), t, obs, source=source,
                               prompt_tokens=None, options=EXACT, transport_factory=transport_factory) as load:
            if load is None:
                continue
            for size in sizes:
                if not await _run_step(run, load, obs, Step(size), prompts[size], runner):
                    break


@dataclass(frozen=True, slots=True)
class StepPrompt:
    body: str | None  # None: the step is skipped
    note: str | None = None  # how the prompt was built when it is not exactly the step's size
    skipped: str | None = None  # why no request is sent


def _step_prompt(size: int, fit: FittedPrompt | PromptTooShort | None, n_predict: int, salt_only_below: bool,
                 n_ctx: int | None) -> StepPrompt:
    """The step's prompt, or why the step is skipped: no prompt of that size, or one the server's
    per-slot context (`n_ctx`) cannot hold."""
    if isinstance(fit, FittedPrompt):
        body, note = fit.body, fit.note()
    elif salt_only_below:
        body, note = "", SALT_ONLY_NOTE
    else:
        return StepPrompt(None, skipped=f"skipped: {fit}")
    skipped = context_skip_reason(size, n_predict, n_ctx)
    return StepPrompt(None if skipped else body, note, skipped)


async def _run_step(run: Run, load: TargetLoad, obs: StepObserver, step: Step, prompt: StepPrompt,
                    runner: LevelRunner) -> bool:
    """The step added to its target, then its requests (or why it is skipped); False (and the
    target's error set) when they stopped."""
    t = load.target
    t.steps.append(step)
    step.note, step.skipped = prompt.note, prompt.skipped
    if prompt.body is None:
        obs.step_done(run, t, step)
        return True
    config = load.config
    backend = make_backend(config.api, replace(config.generation, prompt=prompt.body, prompts=()), t.model)
    step.level = stream_level(LevelRun(target=t.label, concurrency=1, prompt_tokens=step.size), run.sink, keep=True)
    t.levels.append(step.level)
    obs.step_started(t, step)
    await runner.run(replace(load, backend=backend), step.level)
    obs.level_done(run, t, step.level)
    obs.step_done(run, t, step)
    if step.level.stopped_reason:
        t.error = f"{t.target.display}: {step.level.stopped_reason} at {step.size:,} tokens"
        return False
    return True
