"""--models against llama-server's router: the models checked before the first level, and the
router's `/models` polled through the levels for its load timeline (core/model_mix.py).

A router (`--models-dir`, `--models-preset`) answers `GET /props` with `"role": "router"` and its
`max_instances` (--models-max), and `GET /models` with `{"data": [{"id", "status": {"value"}}]}`:
each model "unloaded", "loading" or "loaded" (build 11434; /models gives no times, so loadgen
polls it and stamps each change itself). Before the first level: a server that is no router is
refused in one line (exit 1: only the server knows), a name the router does not list too (exit 2:
the user's input); `--models all` becomes every listed model at weight 1.

Reading the router never loads a model: /models and /props are the router's own; its /metrics and
/slots need `?model=` and load an unloaded model (autoload), so they are left alone here.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

from ..client.probe import Probe
from ..core.clock import now_ns
from ..core.errors import EXIT_FAILED, ConfigError
from ..core.model_mix import ModelEvent, ModelMix
from .state import Run, TargetRun, maybe_router

POLL_S = 0.02  # /models answers in well under a millisecond; a load of a small model takes a few hundred


def listed_statuses(status: int, body: bytes) -> dict[str, str] | None:
    """Each model's `status.value` from a router's /models answer; None when it is not a router's list."""
    if status != 200:
        return None
    try:
        data = json.loads(body).get("data")
    except (ValueError, AttributeError):
        return None
    if not isinstance(data, list):
        return None
    out = {}
    for m in data:
        state = m.get("status") if isinstance(m, dict) else None
        if not isinstance(state, dict) or not isinstance(m.get("id"), str):
            return None  # an OpenAI-style list without statuses: not a router
        out[m["id"]] = str(state.get("value"))
    return out


def mix_refusal(mix: ModelMix, where: str, statuses: dict[str, str] | None, what: str) -> ConfigError | None:
    """The refusal of `mix` against a server whose /models gave `statuses` (None: no router list;
    `what` says what it answered instead), or None when the router lists every model asked for."""
    if statuses is None:
        return ConfigError(f"{where} is not a llama-server router (its /models {what} lists no model statuses); "
                           "--models needs llama-server started with --models-dir or --models-preset",
                           exit_code=EXIT_FAILED)
    missing = mix.missing(list(statuses))
    if missing:
        return ConfigError(f"--models asks for {', '.join(missing)}, but the router at {where} lists "
                           f"{', '.join(statuses) or 'no models'} (its /models)")
    return None


async def _router_facts(run: Run, t: TargetRun) -> tuple[int, bytes, int | None]:
    async with Probe(t.target.url, run.config.auth_headers(), insecure=run.config.insecure,
                     server_url=t.target.server_url) as probe:
        status, body = await probe.answer("/models")
        models_max = (await probe.props()).get("max_instances")
    return status, body, models_max if isinstance(models_max, int) else None


def router_without_models(where: str, model: str | None) -> ConfigError | None:
    """The refusal of a run without --models against a router (its /props says role "router"),
    whose requests would name no model (every one an HTTP 400); None when `model` (--model) names one."""
    if model is not None:
        return None
    return ConfigError(f"{where} is a llama-server router (its /props says role router): its requests must name a "
                       "model; give --models NAME:W,...|all, or --model NAME with --api chat or completions",
                       exit_code=EXIT_FAILED)


async def _one_model_of_router(run: Run, targets: list[TargetRun]) -> ModelMix | None:
    """Without --models: a router target refused without --model (ConfigError); with --model NAME,
    NAME as a mix of one (every API's body then names it, llama.cpp's /completion too)."""
    for t in targets:
        if not maybe_router(t.info):
            continue  # no /props, or a server of one model (its slots): nothing more asked
        async with Probe(t.target.url, run.config.auth_headers(), insecure=run.config.insecure,
                         server_url=t.target.server_url) as probe:
            role = (await probe.props()).get("role")
        if role != "router":
            continue
        refusal = router_without_models(f"{t.label} ({t.target.display})", run.config.model)
        if refusal is not None:
            raise refusal
        assert run.config.model is not None
        return None if run.config.several_processes else ModelMix(((run.config.model, 1),))
    return None


async def refuse_model_mix(run: Run, targets: list[TargetRun]) -> None:
    """A --models run, before the first level: each target's /models against the mix (the first
    refusal raised, ConfigError); `all` resolved to the first target's models. Without --models, a
    router refused, or with --model NAME run as `--models NAME`."""
    mix = run.config.generation.model_mix
    if mix is None:
        mix = await _one_model_of_router(run, targets)
        if mix is not None:
            run.config = replace(run.config, generation=replace(run.config.generation, model_mix=mix))
    if mix is None:
        return
    for i, t in enumerate(targets):
        status, body, t.models_max = await _router_facts(run, t)
        statuses = listed_statuses(status, body)
        what = f"answered HTTP {status}" if status else f"failed ({body.decode(errors='replace')})"
        refusal = mix_refusal(mix, f"{t.label} ({t.target.display})", statuses, what)
        if refusal is not None:
            raise refusal
        if i == 0 and mix.every_listed:
            assert statuses is not None
            resolved = mix.resolved(list(statuses))
            run.config = replace(run.config, generation=replace(run.config.generation, model_mix=resolved))


async def _poll(run: Run, t: TargetRun) -> None:
    seen: dict[str, str] = {}
    async with Probe(t.target.url, run.config.auth_headers(), insecure=run.config.insecure,
                     server_url=t.target.server_url) as probe:
        while True:
            sent = now_ns()
            status, body = await probe.answer("/models")
            at = (sent + now_ns()) // 2
            for name, value in (listed_statuses(status, body) or {}).items():
                if seen.get(name) != value:
                    seen[name] = value
                    t.model_events.append(ModelEvent(at, name, value))
            await asyncio.sleep(POLL_S)


@asynccontextmanager
async def router_timeline(run: Run, targets: list[TargetRun]) -> AsyncIterator[None]:
    """While entered, with --models, each target's /models polled every POLL_S into its `model_events`."""
    tasks: list[asyncio.Task[Any]] = []
    if run.config.generation.model_mix is not None:
        tasks = [asyncio.create_task(_poll(run, t)) for t in targets]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
