"""--images before the first level: every target must take images, and what they cost it is measured.

Refused in one line, exit 1 (only the server knows): a llama-server whose `/props` says
`modalities.vision` false (started without `--mmproj`), and any server that answers a request with
images with an error (its message named). A server whose /props says nothing of modalities (not
llama-server) is asked directly.

Three requests (one token each, the run's own API and text, distinct salts) then measure, from the
server's own counts: the text alone, the first request with images, and a second one with other
(salted) images. `image_tokens` is the prompt tokens the images add (prompt_n with images minus
without; the salts are the run's kind, so a record's image tokens are its prompt_n minus
`text_prompt_n` where the run sends one prompt; each count is the whole prompt, prompt_n plus
cache_n); the prompt times with and without
images give the images' cost (the encoder and their prefill: llama-server reports no encoder time
apart), and the first image request against the second is the warm-up (llama-server's start-up
warm-up skips the encoder, llama.cpp #27147). The figures go into run.json's target `images`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..client.backends import make_backend
from ..client.probe import Probe
from ..core.errors import EXIT_FAILED, ConfigError
from ..core.records import ServerOutcome
from .config import SweepConfig
from .salts import new_salt
from .state import TargetRun


def projector_refusal(modalities: dict[str, Any] | None, where: str) -> ConfigError | None:
    """The refusal of images for a server whose /props says `modalities`, or None (it takes
    images, or does not say)."""
    if modalities is not None and modalities.get("vision") is False:
        return ConfigError(f"{where} takes no images (its /props says modalities.vision false): start llama-server "
                           "with --mmproj FILE, or drop --images", exit_code=EXIT_FAILED)
    return None


def image_figures(text: ServerOutcome, first: ServerOutcome, later: ServerOutcome) -> dict[str, Any]:
    """run.json's target `images` from the three measuring requests' outcomes."""
    def n(o: ServerOutcome) -> int | None:  # the whole prompt: the tokens computed and those read from the cache
        computed = o.prompt_n if o.prompt_n is not None else (o.usage.prompt_tokens if o.usage else None)
        return None if computed is None else computed + (o.cache_n or 0)

    n_text, n_first, n_later = n(text), n(first), n(later)
    return {
        "image_tokens": n_first - n_text if n_first is not None and n_text is not None else None,
        "text_prompt_n": n_text, "prompt_n": n_first,
        "later_prompt_n": n_later,
        "prompt_ms_text": text.prompt_ms, "prompt_ms_first": first.prompt_ms, "prompt_ms_later": later.prompt_ms,
        "cache_n_later": later.cache_n,
    }


async def check_images(config: SweepConfig, targets: list[TargetRun]) -> None:
    """An --images run, before the first level: refuse a target without a projector, measure the rest."""
    g = config.generation
    if g.images is None:
        return
    one = replace(g, n_predict=1, stream=False, prompts=(), n_predicts=())
    for t in targets:
        where = f"{t.label} ({t.target.display})"
        plain, with_images = (make_backend(config.api, replace(one, images=im), t.model) for im in (None, g.images))
        async with Probe(t.target.url, config.auth_headers(), timeout_s=config.timeout_s, insecure=config.insecure,
                         server_url=t.target.server_url) as probe:
            refusal = projector_refusal(await probe.modalities(), where)
            if refusal is not None:
                raise refusal
            outcomes = []
            for backend in (plain, with_images, with_images):  # salts as the run's: the same text length
                status, body = await probe.post(backend.path, backend.build(new_salt(), 0))
                outcome = backend.parse(status, body) if status else ServerOutcome("unreachable", body.decode())
                if outcome.error_kind is not None:
                    raise ConfigError(f"{where} refused a request with images: {outcome.error_message}",
                                      exit_code=EXIT_FAILED)
                outcomes.append(outcome)
        t.images = image_figures(*outcomes)
