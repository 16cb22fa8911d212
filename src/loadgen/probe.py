"""Asks a llama-server about itself: `/health`, `/props`, `/metrics`.

Separate from the backends (which speak the completion APIs) and from the engine (which only
schedules). Everything here tolerates a server that lacks an endpoint: it records that it was off.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from .clock import now_ns

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
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"props": self.props, "metrics_enabled": self.metrics_enabled, "notes": self.notes}


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {sample name: value}, unlabelled samples only (llama-server has no labels)."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.labels:
                values[sample.name] = float(sample.value)
    return values


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


class Probe:
    """A small aiohttp session for one target's management endpoints."""

    def __init__(self, base_url: str, headers: Mapping[str, str] | None = None, timeout_s: float = 10):
        self.base_url = base_url.rstrip("/")
        self._headers = dict(headers or {})
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> "Probe":
        self._session = aiohttp.ClientSession(timeout=self._timeout, headers=self._headers)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def _get(self, path: str) -> tuple[int, bytes]:
        assert self._session is not None
        async with self._session.get(self.base_url + path) as resp:
            return resp.status, await resp.read()

    async def wait_ready(self, wait_s: float, on_wait: Callable[[str], None] | None = None) -> None:
        """Return when /health says ok; wait while it answers 503 (loading) for up to wait_s."""
        deadline = now_ns() + int(wait_s * 1e9)
        told = False
        while True:
            try:
                status, body = await self._get("/health")
            except (aiohttp.ClientConnectorError, OSError) as exc:
                raise TargetUnreachable(f"cannot connect ({_first_line(exc)})") from exc
            except asyncio.TimeoutError as exc:
                raise TargetUnreachable("/health did not answer within 10 s") from exc
            except aiohttp.ClientError as exc:
                raise TargetUnreachable(f"does not speak HTTP ({_first_line(exc)})") from exc
            if status == 200:
                return
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

    async def server_info(self) -> ServerInfo:
        info = ServerInfo()
        try:
            status, body = await self._get("/props")
            if status == 200:
                info.props = summarize_props(json.loads(body))
            else:
                info.notes.append(f"/props answered HTTP {status}")
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            info.notes.append(f"/props failed: {_first_line(exc)}")
        info.metrics_enabled = await self.metrics() is not None
        if not info.metrics_enabled:
            info.notes.append("/metrics is off (start llama-server with --metrics to record its counters)")
        return info

    async def metrics(self) -> dict[str, float] | None:
        """The kept /metrics values, or None when the endpoint is off or unreadable."""
        try:
            status, body = await self._get("/metrics")
            if status != 200:
                return None
            values = parse_metrics(body.decode("utf-8", "replace"))
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, UnicodeDecodeError):
            return None
        return {name: values[name] for name in METRIC_NAMES if name in values}


def _first_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:200]
