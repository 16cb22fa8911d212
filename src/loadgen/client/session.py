"""An aiohttp session for a handful of requests beside the load (the probe's scrapes, paramcheck's
canaries): headers, one overall timeout per request, and --insecure for a self-signed certificate.
The load itself goes through a `Transport`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Self

import aiohttp

from .transport import tls_context


class SessionClient:
    """Opened by `async with`, closed on the way out."""

    def __init__(self, headers: Mapping[str, str] | None, timeout_s: float, insecure: bool = False,
                 force_close: bool = False) -> None:
        self._force_close = force_close  # one connection a request, closed after its answer
        self._headers = dict(headers or {}) | ({"Connection": "close"} if force_close else {})
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._insecure = insecure
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Self:
        connector = (aiohttp.TCPConnector(ssl=tls_context(True) if self._insecure else True,
                                          force_close=self._force_close, limit=1 if self._force_close else 100)
                     if self._insecure or self._force_close else None)
        self._session = aiohttp.ClientSession(timeout=self._timeout, headers=self._headers, connector=connector)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
