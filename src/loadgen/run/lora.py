"""--lora-mix before the first level: every target must have the adapters the mix asks for.

The server's `GET /lora-adapters` lists its adapters (`[{"id", "path", "scale", ...}]`, ids from
0). llama-server build 11434 does not refuse a request's unknown adapter id: it applies nothing for
it and answers as the base model, so a mix naming an id the server lacks would measure the base
model under that id's name. Refused here instead, in one line: an id beyond the list is the user's
input (ConfigError, exit 2); a server without adapters (an empty list, or no such endpoint) is
what only the server knows (exit 1), and the message says how to load some.
"""

from __future__ import annotations

import json

from ..client.probe import Probe
from ..core.errors import EXIT_FAILED, ConfigError
from ..core.lora_mix import LoraMix
from .config import SweepConfig
from .state import TargetRun


def lora_refusal(mix: LoraMix, where: str, status: int, body: bytes) -> ConfigError | None:
    """The refusal of `mix` against a server whose /lora-adapters answered `status` and `body`
    (`where` names the server in the message), or None when the server has every adapter asked for."""
    adapters = None
    if status == 200:
        try:
            adapters = json.loads(body)
        except ValueError:
            adapters = None
    if not isinstance(adapters, list):
        what = f"HTTP {status}" if status else body.decode(errors="replace")
        return ConfigError(f"{where}: /lora-adapters did not list adapters ({what}); --lora-mix needs llama-server "
                           "started with --lora FILE", exit_code=EXIT_FAILED)
    if not adapters:
        return ConfigError(f"{where} has no LoRA adapters loaded (its /lora-adapters is empty); start it with "
                           "--lora FILE, or drop --lora-mix", exit_code=EXIT_FAILED)
    missing = mix.out_of_range(len(adapters))
    if missing:
        have = "id 0" if len(adapters) == 1 else f"ids 0-{len(adapters) - 1}"
        return ConfigError(f"--lora-mix asks for adapter {', '.join(map(str, missing))}, but {where} has "
                           f"{len(adapters)} ({have}, its /lora-adapters)")
    return None


async def refuse_lora_mix(config: SweepConfig, targets: list[TargetRun]) -> None:
    """A --lora-mix run, before the first level: each target's /lora-adapters against the mix;
    the first refusal is raised (ConfigError)."""
    mix = config.generation.lora_mix
    if mix is None:
        return
    for t in targets:
        async with Probe(t.target.url, config.auth_headers(), insecure=config.insecure,
                         server_url=t.target.server_url) as probe:
            status, body = await probe.answer("/lora-adapters")
        refusal = lora_refusal(mix, f"{t.label} ({t.target.display})", status, body)
        if refusal is not None:
            raise refusal
