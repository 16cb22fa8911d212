"""Canary requests for `loadgen paramcheck`: one request carrying chosen parameters, sent to a base URL,
and a look at the server's `/slots` and `/props` right after.

The request is built per API with OpenAI parameter names turned into each API's own
(`max_tokens` -> `n_predict`, `logprobs` -> `n_probs` for `/completion`; `logprobs: true` and
`top_logprobs` for chat; `max_tokens` -> `max_output_tokens` and `reasoning_effort` ->
`reasoning.effort` for `/v1/responses`; `/v1/messages` has `max_tokens` like chat). Parameters an API has no field for are left out (the caller says so).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import yarl

from ..core.baseurl import BaseUrl
from .session import SessionClient

ENDPOINTS = {"llamacpp": "/completion", "completions": "/v1/completions", "chat": "/v1/chat/completions",
             "responses": "/v1/responses", "messages": "/v1/messages"}
# Parameters only some APIs have a field for: the chat template's reasoning knobs, and logprobs
# (neither the Responses nor the Messages API takes it).
ONLY_IN = {"reasoning_effort": ("chat", "responses"), "chat_template_kwargs": ("chat",),
           "logprobs": ("llamacpp", "completions", "chat")}


class CanaryError(Exception):
    """A canary got no usable answer; the message (one line) says what happened."""


@dataclass(slots=True)
class Answer:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


def applicable(api: str, param: str) -> bool:
    """Whether the API has a field for the parameter (the reasoning ones are the chat template's)."""
    return api in ONLY_IN.get(param, (api,))


def canary_body(api: str, params: Mapping[str, Any], prompt: str, model: str | None) -> dict[str, Any]:
    """The request body: the prompt, `cache_prompt: false`, and each parameter in the API's own words."""
    body: dict[str, Any] = {"cache_prompt": False}
    if api in ("chat", "messages"):
        body["messages"] = [{"role": "user", "content": prompt}]
    elif api == "responses":
        body["input"] = prompt
    else:
        body["prompt"] = prompt
    if api != "llamacpp" and model:
        body["model"] = model
    for name, value in params.items():
        if not applicable(api, name):
            continue
        if name == "max_tokens" and api == "llamacpp":
            body["n_predict"] = value
        elif name == "max_tokens" and api == "responses":
            body["max_output_tokens"] = value
        elif name == "reasoning_effort" and api == "responses":
            body["reasoning"] = {"effort": value}
        elif name == "logprobs":
            if api == "llamacpp":
                body["n_probs"] = value
            elif api == "chat":
                body["logprobs"], body["top_logprobs"] = True, value
            else:
                body["logprobs"] = value
        else:
            body[name] = value
    return body


class CanaryClient(SessionClient):
    """An aiohttp session for paramcheck's few requests; every path goes under its base URL's prefix."""

    async def _call(self, method: str, base_url: str, path: str, body: Any = None) -> Answer:
        assert self._session is not None, "enter the client first"
        base = BaseUrl.parse(base_url)
        url = yarl.URL(base.url(path), encoded=True)
        try:
            async with self._session.request(method, url, json=body) as resp:
                raw = await resp.read()
                headers = {k.lower(): v for k, v in resp.headers.items()}
        except TimeoutError:
            raise CanaryError(f"{base.text()}{path}: no answer within the timeout") from None
        except aiohttp.ClientError as exc:
            reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            raise CanaryError(f"{base.text()}{path}: {reason}") from None
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = None
        return Answer(resp.status, parsed if isinstance(parsed, dict) else {"_json": parsed}, headers)

    async def post(self, base_url: str, path: str, body: Mapping[str, Any]) -> Answer:
        return await self._call("POST", base_url, path, dict(body))

    async def get(self, base_url: str, path: str) -> Answer:
        return await self._call("GET", base_url, path)


def last_task(slots_answer: Answer) -> tuple[int | None, dict[str, Any]]:
    """(id_task, params) of the slot that ran the most recent task, from a /slots answer; (None, {})
    when /slots is off or shows no task."""
    slots = slots_answer.body.get("_json") if slots_answer.status == 200 else None
    best: tuple[int | None, dict[str, Any]] = (None, {})
    for slot in slots if isinstance(slots, list) else []:
        task = slot.get("id_task") if isinstance(slot, dict) else None
        if isinstance(task, int) and task >= 0 and (best[0] is None or task > best[0]):
            params = slot.get("params")
            best = (task, params if isinstance(params, dict) else {})
    return best
