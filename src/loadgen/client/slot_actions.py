"""llama-server's slot actions: `POST /slots/{id}?action=save|restore|erase` (a server started with
`--slot-save-path DIR`; without it every action answers HTTP 501 "This server does not support
slots action. Start it with `--slot-save-path`").

Each answer is a `SlotAction`, named as the server names its fields: save gives `n_saved` (the
slot's tokens written) and `n_written` (the file's bytes) with `timings.save_ms`, restore
`n_restored` and `n_read` with `timings.restore_ms`, erase `n_erased`. What the run does with them
is run/slots.py's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping

import aiohttp
import msgspec
import yarl

from ..core.baseurl import BaseUrl
from .session import SessionClient


class SlotActionFailed(Exception):
    """The server refused a slot action (the message is its own, one line, with the HTTP status), or
    no answer came (`status` None: the connection's failure)."""

    def __init__(self, status: int | None, message: str) -> None:
        super().__init__(message if status is None else f"HTTP {status}: {message}")
        self.status = status


class _Timings(msgspec.Struct):
    save_ms: float | None = None
    restore_ms: float | None = None


class SlotAction(msgspec.Struct, frozen=True):
    """One answer to a slot action, as llama-server names its fields; `client_ms` the round trip."""

    action: str
    id_slot: int | None = None
    filename: str | None = None
    n_saved: int | None = None
    n_written: int | None = None
    n_restored: int | None = None
    n_read: int | None = None
    n_erased: int | None = None
    save_ms: float | None = None
    restore_ms: float | None = None
    client_ms: float | None = None


class _Answer(msgspec.Struct):
    id_slot: int | None = None
    filename: str | None = None
    n_saved: int | None = None
    n_written: int | None = None
    n_restored: int | None = None
    n_read: int | None = None
    n_erased: int | None = None
    timings: _Timings | None = None


def error_message(body: bytes) -> str:
    """The server's `error.message` of an error body, else the body's start."""
    try:
        data = json.loads(body)
    except ValueError:
        return body[:120].decode("utf-8", "replace").strip() or "no message"
    err = data.get("error") if isinstance(data, dict) else None
    message = err.get("message") if isinstance(err, dict) else None
    return str(message) if message else json.dumps(data)[:120]


def parse_action(action: str, status: int, body: bytes, client_ms: float) -> SlotAction:
    """The answer typed; SlotActionFailed for an error status or an answer that is not the action's."""
    if status != 200:
        raise SlotActionFailed(status, error_message(body))
    try:
        a = msgspec.json.decode(body, type=_Answer)
    except msgspec.DecodeError as exc:
        raise SlotActionFailed(status, f"the {action} answer is not what llama-server sends ({exc})") from None
    t = a.timings or _Timings()
    return SlotAction(action, a.id_slot, a.filename, a.n_saved, a.n_written, a.n_restored, a.n_read, a.n_erased,
                      t.save_ms, t.restore_ms, client_ms)


class SlotClient(SessionClient):
    """Slot actions on one server, an aiohttp session of their own beside the load."""

    def __init__(self, base_url: str, headers: Mapping[str, str] | None = None, timeout_s: float = 60,
                 insecure: bool = False) -> None:
        super().__init__(headers, timeout_s, insecure)
        self._base = BaseUrl.parse(base_url)

    async def _act(self, slot: int, action: str, filename: str | None) -> SlotAction:
        assert self._session is not None
        url = yarl.URL(self._base.url(f"/slots/{slot}"), encoded=True).with_query(action=action)
        started = time.perf_counter()
        try:
            async with self._session.post(url, json={"filename": filename} if filename else {}) as resp:
                body = await resp.read()
                status = resp.status
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise SlotActionFailed(None, f"no answer to {action} ({type(exc).__name__}: {exc})") from None
        return parse_action(action, status, body, (time.perf_counter() - started) * 1e3)

    async def save(self, slot: int, filename: str) -> SlotAction:
        return await self._act(slot, "save", filename)

    async def restore(self, slot: int, filename: str) -> SlotAction:
        return await self._act(slot, "restore", filename)

    async def erase(self, slot: int) -> SlotAction:
        return await self._act(slot, "erase", None)
