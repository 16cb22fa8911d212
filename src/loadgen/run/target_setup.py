"""Per-target setup, the same for every kind of run: wait for the server and ask it about itself,
label it, open its transport, warm it up, sample its /metrics and /slots during a level, and build
its requests with the request source the config asks for (run/request_source.py).

`target_load` is the one skeleton of a target's load, for every run kind that sends levels (sweep,
soak): prompts -> backend -> transport -> warm-up, then the caller's levels (each: connect-ahead ->
probe sampling -> run, through a `LevelRunner`), then close. Prefill and depth (run/steps.py) cut a
prompt per step, so they use its stages (`open_transport`, `warm_up`) one by one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from ..analysis.aggregate import typical_latency_s
from ..analysis.context import context_overflow
from ..analysis.evidence import not_an_llm_server
from ..client.backends import CHAT_TEMPLATE_APIS, OPENAI_APIS, Backend, make_backend
from ..client.backends.embeddings import AnswerBackend
from ..client.probe import Probe, ServerInfo, TargetUnreachable
from ..client.registry import make_transport
from ..client.tokenize import TokenizeUnavailable, server_tokenizer
from ..client.transport import Transport
from ..core.errors import EXIT_FAILED, ConfigError, UserError
from ..core.records import LevelRun, ProbeSample
from .answer_check import CheckedBackend, ReferenceFailed, reference_pass
from .config import SweepConfig, Target
from .engine import EngineOptions, run_level
from .exact_prompt import salted
from .labels import about
from .level_runner import TargetLoad
from .prompts import PromptSource
from .request_source import TargetRequests, source_for
from .salts import new_salt
from .state import Run, RunObserver, TargetRun, maybe_router, resolve_labels, slot_context

TransportFactory = Callable[[], Transport]


def target_probe(config: SweepConfig, t: TargetRun) -> Probe:
    """The target's probe: /health and /v1/models of its URL; /props, /slots and /metrics of its
    --server-url when one is given (a gateway rarely forwards them)."""
    return Probe(t.target.url, config.auth_headers(), insecure=config.insecure, server_url=t.target.server_url)


async def prepare(config: SweepConfig, t: TargetRun, obs: RunObserver) -> None:
    """Wait for the server (`t.error` set when it never answers), record what it says about itself,
    and pick the model name the OpenAI APIs send."""
    async with target_probe(config, t) as probe:
        try:
            await probe.wait_ready(config.wait_ready_s,
                                   on_wait=lambda what: obs.message(f"{t.target.hostport}: waiting, server is {what}"))
        except TargetUnreachable as exc:
            t.error = about(t.target.shown, str(exc))
            return
        t.info = await probe.server_info()
    if config.api in OPENAI_APIS:
        t.model = config.model or (t.info.models[0] if t.info.models else None)
        if t.model is None:
            obs.message(f"{t.target.hostport}: /v1/models named no model, so requests carry none "
                        "(give --model if the server needs one)")


async def prepare_targets(run: Run, obs: RunObserver, *, note_metrics_off: bool = False) -> list[TargetRun]:
    """Fill `run.targets`: wait for each target, ask it about itself, label it; return the reachable
    ones. With `note_metrics_off`, say which of them hide the deferred queue (of those that answered
    /props or /v1/models: a server that answered neither is told only if it is not an LLM server)."""
    run.targets = [TargetRun(target=t, label=t.label or t.hostport) for t in run.config.targets]
    await asyncio.gather(*(prepare(run.config, t, obs) for t in run.targets))
    resolve_labels(run.targets)
    for t in run.targets:
        if t.error:
            obs.message(f"{about(t.label, t.error)}; skipping this target")
        elif (note_metrics_off and t.info and not t.info.metrics_enabled and not maybe_router(t.info)
              and (t.info.props is not None or t.info.models)):
            # a router's /metrics answers per model only (?model=, run/router.py): not "off"
            # only for a server that said what it is (/props or /v1/models): one that answered neither
            # may be no LLM server at all, which the warm-up tells first and alone
            obs.message(f"{t.label}: /metrics is off or unreadable, so the deferred queue is not visible; "
                        "queuing is judged from /slots and per-request timings")
    if run.checkpoint is not None:  # the servers' facts on disk before the first level (a kill -9 keeps them)
        run.checkpoint()
    return [t for t in run.targets if t.error is None]


def label_targets(targets: tuple[Target, ...], headers: dict[str, str], insecure: bool) -> list[TargetRun]:
    """The targets labelled as a run labels them (a server that does not answer: host:port), each
    with what it said about itself; on an event loop of its own (`loadgen observe` sends no load)."""
    runs = [TargetRun(target=t, label=t.label or t.hostport) for t in targets]

    async def ask(t: TargetRun) -> None:
        async with Probe(t.target.probe_url, headers, timeout_s=5, insecure=insecure) as probe:
            t.info = await probe.server_info()

    async def ask_all() -> None:
        await asyncio.gather(*(ask(t) for t in runs))

    asyncio.run(ask_all())
    resolve_labels(runs)
    return runs


@contextlib.asynccontextmanager
async def ready_probe(config: SweepConfig, target: Target) -> AsyncIterator[Probe]:
    """A probe of `target` once /health says it is ready (up to --wait-ready), for a kind's checks
    before its first request; a target that cannot be reached is one line (UserError, exit 1)."""
    async with Probe(target.url, config.auth_headers(), config.timeout_s, config.insecure) as probe:
        try:
            await probe.wait_ready(config.wait_ready_s)
        except TargetUnreachable as exc:
            raise UserError(f"{target.display}: {exc}", EXIT_FAILED) from None
        yield probe


async def open_transport(config: SweepConfig, t: TargetRun, obs: RunObserver, connections: int,
                         factory: TransportFactory | None = None) -> Transport:
    """The target's transport (`config.transport`'s unless a factory is given), opened with a pool of
    `connections` (0: no limit)."""
    transport = factory() if factory is not None else make_transport(config.transport, t.target.url, obs.message)
    await transport.open(t.target.url, connections, config.timeout_s, config.auth_headers(), insecure=config.insecure,
                         close_streams=t.info.closes_streams if t.info else True, stall_s=config.stall_s)
    return transport


@contextlib.asynccontextmanager
async def target_load(config: SweepConfig, t: TargetRun, obs: RunObserver, *, source: PromptSource,
                      prompt_tokens: int | None, options: EngineOptions,
                      transport_factory: TransportFactory | None = None) -> AsyncIterator[TargetLoad | None]:
    """The target made ready for its levels, inside the block: its prompts (`target_generation`), its backend, its
    transport (a pool of `config.connections_per_target`), `config.warmup` unrecorded requests one
    after another. None instead when the target stopped on the way (its error is set: prompts that
    cannot be cut, a failed warm-up). The transport is closed, and the target's read clock noted,
    when the block ends."""
    fitted = await target_generation(config, t, obs, source, prompt_tokens, options)
    if fitted is None:
        yield None
        return
    generation, options, shapes = fitted
    backend = make_backend(config.api, generation, t.model)
    transport = await open_transport(config, t, obs, config.connections_per_target, transport_factory)
    try:
        if isinstance(backend, AnswerBackend):  # embeddings, rerank: their answers checked under load
            checked = await checked_backend(t, transport, backend)
            if checked is None:
                yield None
                return
            backend = checked
        warm = None
        if config.warmup > 0:
            warm = await warm_up(t, transport, backend, config.warmup, EngineOptions(salt=options.salt))
            if warm is None:
                yield None
                return
        yield TargetLoad(config, t, generation, options, transport, backend, obs, shapes,
                         warm_latency_s=None if warm is None else typical_latency_s(warm))
    finally:
        t.read_clock = transport.read_clock
        await transport.close()


async def target_generation(config: SweepConfig, t: TargetRun, obs: RunObserver, source: PromptSource,
                            prompt_tokens: int | None, options: EngineOptions) -> TargetRequests | None:
    """The request bodies for this target, the engine options their salts need, and the request
    shapes a level cycles through (empty: one shape), built by the request source the config asks
    for (run/request_source.py `source_for`: a shared prefix, dataset answers, a trace, drawn
    lengths, a fixed `prompt_tokens` cut from `source`, else the config's prompts as given). None,
    and the target's error set, when they cannot be built."""
    return await source_for(config, prompt_tokens, source).build(config, t, obs, options)


async def warm_up(t: TargetRun, transport: Transport, backend: Backend, requests: int,
                  options: EngineOptions) -> LevelRun | None:
    """`requests` unrecorded requests one after another: their level (the caller may learn from it,
    it is not part of the results), or None (and `t.error` set) when they failed."""
    warm = LevelRun(target=t.label, concurrency=1)
    await run_level(warm, transport, backend, requests=requests, duration_s=None, options=options)
    if warm.stopped_reason:
        t.error = f"{t.target.display}: warm-up failed, {warm.stopped_reason}"
        return None
    return None if refuse_non_llm(t, warm, backend) else warm


async def checked_backend(t: TargetRun, transport: Transport, backend: AnswerBackend) -> CheckedBackend | None:
    """The backend whose check requests are judged against the check texts answered alone (run/answer_check.py);
    None, and the target's error set to what the server answered, when it would not answer them."""
    try:
        reference = await reference_pass(transport, backend)
    except ReferenceFailed as exc:
        t.error = f"{t.target.display}: {exc}"
        return None
    return CheckedBackend(backend, reference)


def refuse_non_llm(t: TargetRun, level: LevelRun, backend: Backend) -> bool:
    """True, and the target's error set (one line: the target and what it answered), when the
    level's requests all failed as those to a server without this completion endpoint do."""
    records = level.records if level.aggregate is None else level.aggregate.sample
    answer = not_an_llm_server(list(records), f"{backend.method} {backend.path}")
    if answer is None:
        return False
    t.error = f"{t.target.display}: {answer}"
    return True


@contextlib.asynccontextmanager
async def probe_sampling(probe: Probe, t: TargetRun, key: int | float, interval_s: float,
                         level: LevelRun, on_sample: Callable[[ProbeSample], None] | None = None
                         ) -> AsyncIterator[None]:
    """Scrape the server's /metrics and /slots every `interval_s` into `level.probe_samples` while
    inside, each sample also handed to `on_sample` (run/recording.py `probe_stream`); an interval
    of 0 scrapes nothing."""
    if interval_s <= 0:
        yield
        return
    sampler = asyncio.ensure_future(probe.sample_until_cancelled(
        t.label, key, t.info or ServerInfo(), interval_s, level.probe_samples, on_sample))
    try:
        yield
    finally:
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)


def refuse_prompts_beyond_context(targets: list[TargetRun], prompt_tokens: int | None, n_predict: int,
                                  what: str = "--prompt-tokens {n}") -> None:
    """--prompt-tokens in a sweep or soak, before the first level: every request has that length, so
    a target whose per-slot context cannot hold it and its n_predict tokens would answer each one with
    an error (or cut it short). Refused as bad input (ConfigError, exit 2), naming the target; the
    check is prefill's and depth's (`analysis.context`), which skip such a size instead. `what` names
    the length in the message ({n}: the tokens)."""
    if not prompt_tokens:
        return
    for t in targets:
        problem = context_overflow(prompt_tokens, n_predict, slot_context(t))
        if problem:
            raise ConfigError(f"{t.label} ({t.target.display}) cannot take {what.format(n=prompt_tokens)}: {problem}; "
                              "ask for fewer tokens, or restart the server with a larger -c or fewer --parallel slots")


# Prompts measured per target for the context check of the run's own texts: the longest by characters.
MEASURED_PROMPTS = 64


async def refuse_given_prompts_beyond_context(config: SweepConfig, targets: list[TargetRun], obs: RunObserver) -> None:
    """The run's prompts as given (the default prompt, --prompt, a prompt file or dataset), before
    the first level: their real length on each target (its /tokenize, the salt and, for a chat API,
    the template counted) with n_predict against the per-slot context. One prompt that leaves no room
    for the answer is refused as --prompt-tokens is (ConfigError); of several, those that do not fit
    are named in a note (their answers will be cut, and counted: answers_cut). Runs that cut their
    prompts to a length (--prompt-tokens, a workload, a replay, a shared prefix, dataset answers,
    classes) are checked by length elsewhere; a server without /tokenize is not checked here."""
    if (config.prompt_tokens or config.workload is not None or config.replay is not None
            or config.shared_prefix is not None or config.dataset_entries or config.classes):
        return
    n_predict = config.generation.n_predict
    texts = sorted(set(config.generation.prompt_list), key=len, reverse=True)[:MEASURED_PROMPTS]
    for t in targets:
        n_ctx = slot_context(t)
        if n_ctx is None or not texts:
            continue
        try:
            async with server_tokenizer(t.target.probe_url, headers=config.auth_headers(), timeout_s=config.timeout_s,
                                        insecure=config.insecure) as tokenizer:
                template = await tokenizer.template_overhead() if config.api in CHAT_TEMPLATE_APIS else 0
                lengths = [await tokenizer.count(salted(new_salt(), text)) + template for text in texts]
        except TokenizeUnavailable:
            continue
        over = [n for n in lengths if context_overflow(n, n_predict, n_ctx)]
        if not over:
            continue
        problem = context_overflow(max(over), n_predict, n_ctx)
        if len(texts) == 1:
            raise ConfigError(f"{t.label} ({t.target.display}) cannot take the prompt ({max(over):,} tokens with the "
                              f"salt) and its answer: {problem}; every answer would be cut by the context. Ask for "
                              "fewer tokens (--n-predict), or restart the server with a larger -c or fewer --parallel slots")
        obs.message(f"{t.label}: {len(over)} of the {len(texts)} longest prompts leave no room for n_predict "
                    f"{n_predict} in the per-slot context (e.g. {problem}): their answers will be cut, and counted "
                    "as answers_cut")
