"""Asks a llama-server about itself: `/health`, `/props`, `/metrics`.

Separate from the backends (which speak the completion APIs) and from the engine (which only
schedules). Everything here tolerates a server that lacks an endpoint: it records that it was off.

Paths go under the base URL's prefix (core.baseurl). Behind a gateway that does not forward the
server's own endpoints, `server_url` names the server itself: `/props`, `/slots` and `/metrics` are
asked there, while `/health` (is the target up?) and `/v1/models` (the name the target wants) are
asked of the target.

The probe must not disturb the server it watches. llama-server serves HTTP from a pool of threads,
and its HTTP library keeps a thread on a keep-alive connection until that connection has been idle
for its keep-alive timeout (5 s): a probe holding keep-alive connections of its own takes threads
the requests may need. So the probe uses one connection at a time and closes it after every answer
(`Connection: close`): a scrape asks /metrics, then /slots, and gives its thread back at once. Its
schedule adapts (`scrape_delay_s`): dense at a level's start (so a short level is still seen
several times), then every `interval_s`, and never so often that scraping takes more than
PROBE_COST_SHARE of the time (a slow server, one busy with a long prefill, is asked less often).
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import yarl
from prometheus_client.parser import text_string_to_metric_families

from ..core.baseurl import BaseUrl
from ..core.clock import now_ns
from ..core.records import ProbeSample
from .session import SessionClient
from .transport import connect_reason

# A level's first DENSE_SCRAPES scrapes come every interval / DENSE_DIVISOR (not below
# DENSE_MIN_S): a level of a second still gets several. After every scrape the next waits at least
# its duration / PROBE_COST_SHARE: the probe occupies one HTTP thread at most 5% of the time.
DENSE_SCRAPES = 8
DENSE_DIVISOR = 4
DENSE_MIN_S = 0.025
PROBE_COST_SHARE = 0.05


def scrape_delay_s(index: int, interval_s: float, last_scrape_s: float) -> float:
    """How long after scrape `index` (0 for a level's first) starts the next one (see DENSE_SCRAPES)."""
    base = max(DENSE_MIN_S, interval_s / DENSE_DIVISOR) if index < DENSE_SCRAPES - 1 else interval_s
    return max(min(base, interval_s), last_scrape_s / PROBE_COST_SHARE)


# Counters and gauges kept from /metrics, named exactly as llama-server emits them.
METRIC_NAMES = (
    "llamacpp:prompt_tokens_total",
    "llamacpp:prompt_seconds_total",
    "llamacpp:tokens_predicted_total",
    "llamacpp:tokens_predicted_seconds_total",
    "llamacpp:n_decode_total",
    "llamacpp:requests_processing",
    "llamacpp:requests_deferred",
)


class TargetUnreachable(Exception):
    """The target did not answer at all, or never became ready. The message is for the user."""


@dataclass(slots=True)
class ServerInfo:
    """What a server said about itself before the sweep."""

    props: dict[str, Any] | None = None  # subset of /props, or None when it has none
    metrics_enabled: bool = False
    slots_enabled: bool = False
    slot_count: int | None = None  # length of the /slots array
    endpoints: dict[str, int | None] = field(default_factory=dict)  # path -> HTTP status (None: no answer)
    notes: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)  # ids from /v1/models, in the server's order
    # Whether the server drafts tokens (speculative decoding): True or False as its /slots entries'
    # `speculative` say, None when nothing said (no /slots, not llama-server). See `server_speculates`.
    speculative: bool | None = None

    @property
    def closes_streams(self) -> bool:
        """llama-server (it answers /props) closes the connection after every streamed response,
        although it announces keep-alive; other servers keep it open. Unknown: assume it closes."""
        return self.props is not None or not self.endpoints

    @property
    def total_slots(self) -> int | None:
        if self.props and isinstance(self.props.get("total_slots"), int):
            return self.props["total_slots"]
        return self.slot_count

    def to_dict(self) -> dict[str, Any]:
        return {"props": self.props, "metrics_enabled": self.metrics_enabled, "slots_enabled": self.slots_enabled,
                "slot_count": self.slot_count, "total_slots": self.total_slots, "endpoints": self.endpoints,
                "notes": self.notes, "models": self.models, "speculative": self.speculative}


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {sample name: value}, unlabelled samples only (llama-server has no labels)."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.labels and math.isfinite(sample.value):
                values[sample.name] = float(sample.value)
    return values


def server_speculates(slots: Sequence[Any]) -> bool | None:
    """Whether llama-server speculates, from its /slots array: each entry's `speculative` is the
    slot's `can_speculate()` (a draft model, MTP head or n-gram drafter is set up for it), so True
    when any slot says so, False when every slot that says anything says no, None when none says
    (an older build, or not llama-server). `/props`' "speculative.types" is not asked: it is the
    per-request default and reads "none" on a server started with --spec-type.
    """
    said = [s["speculative"] for s in slots if isinstance(s, Mapping) and isinstance(s.get("speculative"), bool)]
    return any(said) if said else None


def summarize_props(props: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of /props a run records: slots, per-slot context, alias, build."""
    settings = props.get("default_generation_settings") or {}
    return {
        "total_slots": props.get("total_slots"),
        "n_ctx": settings.get("n_ctx") if isinstance(settings, dict) else None,
        "model_alias": props.get("model_alias"),
        "model_path": props.get("model_path"),
        "build_info": props.get("build_info"),
    }


class Probe(SessionClient):
    """A small aiohttp session for one target's management endpoints."""

    def __init__(self, base_url: str, headers: Mapping[str, str] | None = None, timeout_s: float = 10,
                 insecure: bool = False, server_url: str | None = None):
        # One connection at a time, closed after each answer: see the module's docstring.
        super().__init__(headers, timeout_s, insecure, force_close=True)
        self.base_url = base_url.rstrip("/")
        self._target = BaseUrl.parse(base_url)
        self._server = BaseUrl.parse(server_url) if server_url else self._target
        self._metrics_status: int | None = None  # of the last /metrics scrape (None: no answer)

    async def _get(self, path: str, of_target: bool = False) -> tuple[int, bytes]:
        """GET a path of the server (`server_url`), or of the target itself."""
        assert self._session is not None
        base = self._target if of_target else self._server
        async with self._session.get(yarl.URL(base.url(path), encoded=True)) as resp:
            return resp.status, await resp.read()

    async def wait_ready(self, wait_s: float, on_wait: Callable[[str], None] | None = None) -> None:
        """Return when /health says ok; wait while it answers 503 (loading) for up to wait_s."""
        deadline = now_ns() + int(wait_s * 1e9)
        told = False
        while True:
            try:
                status, body = await self._get("/health", of_target=True)
            except TimeoutError as exc:  # before OSError: TimeoutError is one since 3.11
                raise TargetUnreachable("/health did not answer within 10 s") from exc
            except aiohttp.ClientConnectorCertificateError as exc:
                raise TargetUnreachable(connect_reason(exc.certificate_error, urlsplit(self.base_url).netloc)) from exc
            except aiohttp.ClientConnectorError as exc:
                raise TargetUnreachable(connect_reason(exc.os_error, urlsplit(self.base_url).netloc)) from exc
            except (aiohttp.ClientError, OSError) as exc:
                raise TargetUnreachable(_unreachable(exc)) from exc
            if status == 200:
                return
            if status in (401, 403):
                raise TargetUnreachable(f"/health answered HTTP {status}: the server wants an API key "
                                        "(set LOADGEN_API_KEY or --api-key)")
            if status == 404:  # not a llama-server (an OpenAI-compatible server without /health)
                return
            if status != 503:
                raise TargetUnreachable(f"/health answered HTTP {status}")
            if now_ns() >= deadline:
                raise TargetUnreachable(f"still loading after {wait_s:g} s (raise --wait-ready)")
            if on_wait and not told:
                on_wait("loading the model")
                told = True
            await asyncio.sleep(0.25)

    async def _get_json(self, path: str, info: ServerInfo, of_target: bool = False) -> Any:
        try:
            status, body = await self._get(path, of_target)
        except (TimeoutError, aiohttp.ClientError) as exc:
            info.endpoints[path] = None
            info.notes.append(f"{path} failed: {_first_line(exc)}")
            return None
        info.endpoints[path] = status
        if status != 200:
            return None
        try:
            return json.loads(body, parse_constant=_reject_constant)
        except ValueError:
            info.notes.append(f"{path} is not JSON")
            return None

    async def server_info(self) -> ServerInfo:
        """What /props, /slots and /metrics say before the sweep, or that they are off."""
        info = ServerInfo()
        props = await self._get_json("/props", info)
        if isinstance(props, dict):
            info.props = summarize_props(props)
        models = await self._get_json("/v1/models", info, of_target=True)
        if isinstance(models, dict) and isinstance(models.get("data"), list):
            info.models = [str(m["id"]) for m in models["data"] if isinstance(m, dict) and "id" in m]
        slots = await self._get_json("/slots", info)
        if isinstance(slots, list):
            info.slots_enabled, info.slot_count = True, len(slots)
            info.speculative = server_speculates(slots)
        metrics = await self.metrics()
        info.endpoints["/metrics"] = self._metrics_status
        info.metrics_enabled = metrics is not None
        if not info.metrics_enabled and self._metrics_status == 200:
            info.notes.append("/metrics answered but is not Prometheus text, so it is not used")
        elif not info.metrics_enabled:
            info.notes.append("/metrics is off: start llama-server with --metrics to see its deferred queue")
        return info

    async def props(self) -> dict[str, Any]:
        """The server's /props object now ({}: no answer, not 200, not a JSON object), for the few
        facts asked again after server_info: `is_sleeping`, `modalities`, a router's `role`."""
        try:
            status, body = await self._get("/props")
            props = json.loads(body) if status == 200 else None
        except (TimeoutError, aiohttp.ClientError, ValueError):
            return {}
        return props if isinstance(props, dict) else {}

    async def is_sleeping(self) -> bool | None:
        """/props' `is_sleeping` (llama-server's --sleep-idle-seconds; build 11434 answers it without
        waking); None: the server does not say."""
        value = (await self.props()).get("is_sleeping")
        return value if isinstance(value, bool) else None

    async def modalities(self) -> dict[str, Any] | None:
        """/props' `modalities` (llama-server: `{"vision": bool, "audio": bool, ...}`), or None when
        it says none (not llama-server, no answer). Asked before an --images run's first level."""
        found = (await self.props()).get("modalities")
        return found if isinstance(found, dict) else None

    async def answer(self, path: str) -> tuple[int, bytes]:
        """(HTTP status, body) of the server's `GET path` (status 0: no answer, the body says why); the
        caller judges it: a router's /models (run/router.py), /lora-adapters (run/lora.py)."""
        try:
            return await self._get(path)
        except (TimeoutError, aiohttp.ClientError) as exc:
            return 0, _first_line(exc).encode()

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        """(HTTP status, body) of one POST of `body` (JSON) to the target's `path` (status 0: no
        answer, the body says why). For a few requests before the first level (run/images.py)."""
        assert self._session is not None
        try:
            async with self._session.post(yarl.URL(self._target.url(path), encoded=True), data=body,
                                          headers={"Content-Type": "application/json"}) as resp:
                return resp.status, await resp.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            return 0, _first_line(exc).encode()

    async def busy_slots(self) -> int | None:
        """How many slots of /slots are processing now, or None when /slots is off."""
        slots = await self._slots()
        return None if slots is None else sum(1 for s in slots if s.get("is_processing"))

    async def _slots(self) -> list[dict[str, Any]] | None:
        """The /slots array (its objects only), or None when it is off or unreadable."""
        try:
            status, body = await self._get("/slots")
            if status != 200:
                return None
            slots = json.loads(body, parse_constant=_reject_constant)
        except (TimeoutError, aiohttp.ClientError, ValueError):
            return None
        if not isinstance(slots, list):
            return None
        return [s for s in slots if isinstance(s, dict)]

    async def sample(self, target: str, level: int | float, info: ServerInfo) -> ProbeSample:
        """One timestamped look at /metrics, then /slots (one after the other: the probe never holds
        two of the server's HTTP threads)."""
        t_ns = now_ns()
        metrics = await self.metrics() if info.metrics_enabled else None
        slots = await self._slots() if info.slots_enabled else None
        m = metrics or {}
        return ProbeSample(target=target, level=level, t_ns=t_ns,
                           requests_processing=m.get("llamacpp:requests_processing"),
                           requests_deferred=m.get("llamacpp:requests_deferred"),
                           tokens_predicted_total=m.get("llamacpp:tokens_predicted_total"),
                           prompt_tokens_total=m.get("llamacpp:prompt_tokens_total"),
                           n_decode_total=m.get("llamacpp:n_decode_total"),
                           busy_slots=None if slots is None else sum(1 for s in slots if s.get("is_processing")),
                           slot_context_tokens=None if slots is None else [slot_context_used(s) for s in slots],
                           scrape_us=(now_ns() - t_ns) // 1000)

    async def sample_until_cancelled(self, target: str, level: int | float, info: ServerInfo, interval_s: float,
                                     out: list[ProbeSample],
                                     on_sample: Callable[[ProbeSample], None] | None = None) -> None:
        """Append samples until cancelled, on an absolute schedule (no drift): dense at first, then
        every interval_s, never costing the server more than PROBE_COST_SHARE (`scrape_delay_s`).
        Each is also handed to `on_sample` as it comes (to stream it to disk)."""
        if not (info.metrics_enabled or info.slots_enabled):
            return
        next_ns = now_ns()
        index = 0
        while True:
            sample = await self.sample(target, level, info)
            out.append(sample)
            if on_sample is not None:
                on_sample(sample)
            next_ns += int(scrape_delay_s(index, interval_s, (sample.scrape_us or 0) / 1e6) * 1e9)
            index += 1
            delay = (next_ns - now_ns()) / 1e9
            if delay < 0:  # a slow scrape: skip the missed ticks rather than burst
                next_ns = now_ns()
                delay = 0
            await asyncio.sleep(delay)

    async def metrics(self) -> dict[str, float] | None:
        """The kept /metrics values, or None when the endpoint is off or unreadable."""
        self._metrics_status = None
        try:
            status, body = await self._get("/metrics")
            self._metrics_status = status
            if status != 200:
                return None
            values = parse_metrics(body.decode("utf-8", "replace"))
        except (TimeoutError, aiohttp.ClientError, ValueError, UnicodeDecodeError):
            return None
        return {name: values[name] for name in METRIC_NAMES if name in values}


def slot_context_used(slot: Mapping[str, Any]) -> int:
    """Tokens of context a /slots entry's running task holds: n_prompt_tokens + next_token[0].n_decoded
    (0 for an idle slot: what an idle slot keeps is cache, not load)."""
    if not slot.get("is_processing"):
        return 0
    prompt = slot.get("n_prompt_tokens")
    next_token = slot.get("next_token")
    first = next_token[0] if isinstance(next_token, list) and next_token else next_token
    decoded = first.get("n_decoded") if isinstance(first, dict) else None
    return sum(v for v in (prompt, decoded) if isinstance(v, int) and not isinstance(v, bool) and v > 0)


def _unreachable(exc: BaseException) -> str:
    """Why a target that accepted the connection could not be asked /health, in one short line."""
    if isinstance(exc, aiohttp.ClientResponseError):  # the HTTP parser's complaint, with what it got
        reason = " ".join(str(exc.message).split())
        return f"does not speak HTTP ({reason[:120]}{'…' if len(reason) > 120 else ''})"
    if isinstance(exc, aiohttp.ClientError):
        return f"does not speak HTTP ({_first_line(exc)})"
    return f"cannot connect ({_first_line(exc)})"


def _reject_constant(name: str) -> None:
    raise ValueError(f"non-standard JSON constant {name}")


def _first_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:200]
