"""A --models run against llama-server's router, per model: requests, tokens, failures, the cold
loads its requests waited for, and whether the router thrashed (docs/router.md).

Pure: records and the router's polled status timeline in, figures out. The timeline is what
loadgen saw of `GET /models` (each model's `status.value`: "unloaded", "loading", "loaded", ...)
polled through the run, one `ModelEvent` per change (core/model_mix.py); build 11434's /models
carries no load times of its own, so a load's time is the span from the poll that first saw it
"loading" to the one that first saw it "loaded" (to within the poll interval). Only loads seen
happening count ("loading" → "loaded", or unloaded → loaded): a model already loaded at the first
poll (left so by an earlier run) was not loaded by this one.

A request **waited for a load** when its model turned "loaded" after the request was sent and
before its first token (its answer, unstreamed): its time to first token holds the load. Its
**cold-load time** is that TTFT less the request's own prefill as the server timed it (llama-server's
`timings.prompt_ms`), or, where the answer has no timings, less the median TTFT of the model's warm
requests (those that did not wait): the request's own prefill is not counted as load.

A request failed **because** its model was unloaded when the router said so (its 500 "proxy error",
kind `model_unloaded` already, client/backends/router.py), or when it failed while its model was
unloaded (an "unloaded" or "unloading" change between its send and its end), or when its stream was
cut or it got a 5xx and the instance that served it ended soon after (the model's next change after
the send is not "loaded", within UNLOAD_GRACE_NS of the failure: an unload and reload can pass
between two polls). Its kind is then `model_unloaded`, never a plain server error.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from statistics import median

from ..core.model_mix import MODEL_UNLOADED, ModelEvent
from ..core.records import TRUNCATED_STREAM, RequestRecord
from ..core.rundoc import RouterModel, RouterSummary

_GONE = ("unloaded", "unloading")
# A router stops a model's instance and waits up to its stop timeout (10 s by default) for the
# requests in flight: the poll may see the model only when it loads again, that long after the cut.
UNLOAD_GRACE_NS = 15_000_000_000
# a router thrashes when models are loaded again and again: more loads than models, and at least
# this share of the requests waited for one
THRASH_SHARE = 0.05


@dataclass(slots=True)
class ModelFigures:
    """One model's requests over a run (every level of one target)."""

    model: str
    requests: int = 0  # sent (every record but the client's own cancellations)
    ok: int = 0
    prompt_tokens: int = 0  # processed, of the successful requests, as the server counted them
    output_tokens: int = 0
    failures: dict[str, int] = field(default_factory=dict)  # error kind → requests (model_unloaded its own)
    waited: int = 0  # requests that waited for a load of their model
    cold_load_ms: list[float] = field(default_factory=list)  # per waiting request: its TTFT less its prefill
    load_ms: list[float] = field(default_factory=list)  # per load seen in the timeline: loading → loaded
    loads: int = 0  # changes to "loaded" seen happening (not a model loaded when the run began)
    unloads: int = 0  # changes to "unloaded" seen happening

    @property
    def failed(self) -> int:
        return sum(self.failures.values())


@dataclass(frozen=True, slots=True)
class RouterVerdict:
    thrash: bool
    line: str


def _ttft_ns(r: RequestRecord) -> int:
    return (r.first_token_ns or r.complete_ns) - r.send_ns


def _prompt_processed(r: RequestRecord) -> int:
    """The prompt tokens the server processed (llama-server's timings `prompt_n`, as its /metrics
    `prompt_tokens_total` counts them), else the API's usage `prompt_tokens`."""
    if r.prompt_n is not None:
        return r.prompt_n
    return r.usage.prompt_tokens if r.usage is not None and r.usage.prompt_tokens is not None else 0


def loaded_times(events: Iterable[ModelEvent]) -> dict[str, list[int]]:
    """Per model, the times its status turned "loaded": loads seen happening. A model whose first
    polled status is "loaded" was loaded before the run (by an earlier one): not a load."""
    out: dict[str, list[int]] = {}
    seen: set[str] = set()
    for e in events:
        if e.status == "loaded" and e.model in seen:
            out.setdefault(e.model, []).append(e.t_ns)
        seen.add(e.model)
    return out


def unload_count(events: Iterable[ModelEvent], model: str) -> int:
    """The model's changes to "unloaded" seen happening (not its first polled status)."""
    mine = [e for e in events if e.model == model]
    return sum(1 for e in mine[1:] if e.status == "unloaded")


def load_spans_ms(events: Sequence[ModelEvent]) -> dict[str, list[float]]:
    """Per model, each load's span: from the change to "loading" to the next change to "loaded"."""
    started: dict[str, int] = {}
    out: dict[str, list[float]] = {}
    for e in events:
        if e.status == "loading":
            started[e.model] = e.t_ns
        elif e.status == "loaded" and e.model in started:
            out.setdefault(e.model, []).append((e.t_ns - started.pop(e.model)) / 1e6)
    return out


def failure_kind(r: RequestRecord, events: Sequence[ModelEvent]) -> str | None:
    """The record's failure kind, `model_unloaded` when its model (whose changes are `events`) was
    unloaded under it; None when it succeeded."""
    if r.ok:
        return None
    if r.error_kind == MODEL_UNLOADED or any(e.status in _GONE and r.send_ns <= e.t_ns <= r.complete_ns
                                               for e in events):
        return MODEL_UNLOADED
    if r.error_kind == TRUNCATED_STREAM or (r.status or 0) >= 500:
        after = next((e for e in events if e.t_ns > r.send_ns), None)
        if after is not None and after.status != "loaded" and after.t_ns - r.complete_ns <= UNLOAD_GRACE_NS:
            return MODEL_UNLOADED
    return r.error_kind or f"http_{r.status}"


def model_figures(records: Iterable[RequestRecord], events: Sequence[ModelEvent]) -> list[ModelFigures]:
    """Per model, in the order of first appearance by seq; records without a model (no --models run)
    and the client's own cancellations are left out."""
    loaded = loaded_times(events)
    per_model: dict[str, list[ModelEvent]] = {}
    for e in events:
        per_model.setdefault(e.model, []).append(e)
    figures: dict[str, ModelFigures] = {}
    waiting: dict[str, list[tuple[int, float | None]]] = {}  # (TTFT ns, the server's prompt_ms)
    warm: dict[str, list[int]] = {}
    for r in sorted((r for r in records if r.model is not None), key=lambda r: r.seq):
        if r.error_kind in ("cancelled", "lost"):
            continue
        assert r.model is not None
        f = figures.setdefault(r.model, ModelFigures(r.model))
        f.requests += 1
        kind = failure_kind(r, per_model.get(r.model, ()))
        if kind is not None:
            f.failures[kind] = f.failures.get(kind, 0) + 1
            continue
        f.ok += 1
        f.prompt_tokens += _prompt_processed(r)
        f.output_tokens += r.output_tokens or 0
        first = r.first_token_ns or r.complete_ns
        waited = any(r.send_ns < t <= first for t in loaded.get(r.model, ()))
        if waited:
            waiting.setdefault(r.model, []).append((_ttft_ns(r), r.prompt_ms))
        else:
            warm.setdefault(r.model, []).append(_ttft_ns(r))
    spans = load_spans_ms(events)
    for name, f in figures.items():
        f.waited = len(waiting.get(name, ()))
        base_ms = median(warm[name]) / 1e6 if warm.get(name) else 0.0
        f.cold_load_ms = [max(0.0, t / 1e6 - (base_ms if prefill_ms is None else prefill_ms))
                          for t, prefill_ms in waiting.get(name, ())]
        f.load_ms = spans.get(name, [])
        f.loads = len(loaded.get(name, ()))
        f.unloads = unload_count(events, name)
    return list(figures.values())


def thrash_verdict(models: int, models_max: int | None, requests: int, waited: int, loads: int) -> RouterVerdict | None:
    """Whether the router thrashed: its models loaded more often than once each (`loads` > `models`)
    and at least THRASH_SHARE of the `requests` `waited` for a load, on a router that cannot hold
    them all (`models_max` below `models`, or unknown: a router that holds them all reloads only
    what was unloaded otherwise); None without requests. The
    advice: keep each model's requests on a router of their own (affinity), or let the router hold
    every model (--models-max ≥ models)."""
    if requests == 0:
        return None
    share = waited / requests
    on = f"{models} model{'s' if models != 1 else ''} on --models-max {models_max if models_max else '?'}"
    if models_max and models <= models_max and loads > models:
        return RouterVerdict(False, f"{on}: not thrash, but models reloaded with room for all ({loads} loads of "
                                    f"{models} models, {share:.0%} of requests waited): unloaded by hand, by "
                                    "--sleep-idle-seconds or a crash")
    if loads > models and share >= THRASH_SHARE:
        return RouterVerdict(True, f"{on}: {share:.0%} of requests waited for a load ({loads} loads of {models} "
                                   f"models); route each model's requests to a router of its own (affinity) "
                                   f"or start the router with --models-max {models} or more")
    return RouterVerdict(False, f"{on}: no thrash ({loads} loads of {models} models, {share:.0%} of requests "
                                f"waited for a load)")


def router_view(records: Sequence[RequestRecord], events: Sequence[ModelEvent],
                models_max: int | None) -> tuple[list[ModelFigures], RouterVerdict | None]:
    """One target's per-model figures (its records only) and its verdict."""
    figures = model_figures(records, events)
    verdict = thrash_verdict(len(figures), models_max, sum(f.requests for f in figures),
                             sum(f.waited for f in figures), sum(f.loads for f in figures))
    return figures, verdict


def router_summary(records: Sequence[RequestRecord], events: Sequence[ModelEvent],
                   models_max: int | None) -> RouterSummary:
    """One target's router as run.json keeps it (core/rundoc.py RouterSummary)."""
    figures, verdict = router_view(records, events, models_max)
    models = [RouterModel(f.model, f.requests, f.ok, f.failed, f.loads,
                          median(f.cold_load_ms) if f.cold_load_ms else None, f.waited) for f in figures]
    return RouterSummary(models_max, models, verdict.thrash if verdict else None, verdict.line if verdict else None)
