"""Prefill and depth: for each target, a step per prompt length (prefill) or context depth (depth).

A step is one size on one target: the `LevelRun` of its requests, how its prompt was built, or why
it was skipped (state.py's `Step`). The per-target setup is target_setup.py's, the figures
analysis/prefill.py's and analysis/depth.py's.
"""

from __future__ import annotations

from dataclasses import replace

from ..analysis.depth import skip_reason as context_skip_reason
from ..client.backends import Backend, make_backend
from ..client.transport import Transport
from ..core.records import LevelRun
from .engine import EngineOptions, run_level
from .exact_prompt import FittedPrompt, PromptTooShort, fit_prompts
from .state import Run, Step, StepObserver, TargetRun, slot_context
from .prompts import PromptSource
from .recording import stream_level
from .salts import new_decimal_salt
from .target_setup import TransportFactory, open_transport, prepare_targets, warm_up

SALT_ONLY_NOTE = "the shortest prompt there is: the uuid salt alone"
EXACT = EngineOptions(salt=new_decimal_salt)  # salts of a fixed token count, for exact prompt lengths


async def run_steps(run: Run, obs: StepObserver, source: PromptSource, sizes: tuple[int, ...], *,
                    n_predict: int, repeat: int, salt_only_below: bool,
                    transport_factory: TransportFactory | None = None) -> None:
    """For each reachable target in turn, each size in turn: `repeat` requests one after another
    with a prompt of exactly `size` tokens for that target and `n_predict` tokens to generate.

    A size the server's per-slot context cannot hold is skipped with a reason. A size too small to
    hold the salt is skipped too, or, with `salt_only_below` (depth 0), sent as the salt alone.
    """
    config = run.config
    live = await prepare_targets(run, obs)
    for t in live:
        to_cut = [n for n in sizes if n > 0]
        obs.message(f"{t.label}: cutting prompts of {', '.join(f'{n:,}' for n in to_cut)} tokens with its tokenizer")
        fitted = await fit_prompts(t.target.probe_url, source.text, to_cut, api=config.api,
                                   headers=config.auth_headers(),
                                   timeout_s=config.timeout_s, insecure=config.insecure)
        transport = await open_transport(config, t, obs, config.connections_per_target, transport_factory)
        try:
            warm = config.warmup
            for size in sizes:
                backend = _step_backend(run, t, obs, Step(size), fitted.get(size), n_predict, salt_only_below)
                if backend is None:
                    continue
                step = t.steps[-1]
                if warm > 0:  # unrecorded, with the first prompt that fits
                    warm = 0
                    if await warm_up(t, transport, backend, config.warmup, EXACT) is None:
                        break
                if not await _run_step(run, t, obs, step, transport, backend, repeat):
                    break
        finally:
            await transport.close()


def _step_backend(run: Run, t: TargetRun, obs: StepObserver, step: Step,
                  fit: FittedPrompt | PromptTooShort | None, n_predict: int, salt_only_below: bool) -> Backend | None:
    """Add the step to its target; the backend that sends its prompt, or None (and the step done)
    when it is skipped: no prompt of that size, or one the server's per-slot context cannot hold."""
    t.steps.append(step)
    if isinstance(fit, FittedPrompt):
        body, step.note = fit.body, fit.note()
    elif salt_only_below:
        body, step.note = "", SALT_ONLY_NOTE
    else:
        step.skipped = f"skipped: {fit}"
        obs.step_done(run, t, step)
        return None
    step.skipped = context_skip_reason(step.size, n_predict, slot_context(t))
    if step.skipped:
        obs.step_done(run, t, step)
        return None
    config = run.config
    return make_backend(config.api, replace(config.generation, prompt=body, prompts=(), n_predict=n_predict), t.model)


async def _run_step(run: Run, t: TargetRun, obs: StepObserver, step: Step, transport: Transport, backend: Backend,
                    repeat: int) -> bool:
    """The step's `repeat` requests one after another; False (and the target's error set) when they stopped."""
    step.level = stream_level(LevelRun(target=t.label, concurrency=1, prompt_tokens=step.size), run.sink, keep=True)
    t.levels.append(step.level)
    obs.step_started(t, step)
    await run_level(step.level, transport, backend, requests=repeat, duration_s=None, observer=obs, options=EXACT)
    obs.level_done(run, t, step.level)
    obs.step_done(run, t, step)
    if step.level.stopped_reason:
        t.error = f"{t.target.display}: {step.level.stopped_reason} at {step.size:,} tokens"
        return False
    return True
