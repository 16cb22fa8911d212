"""A server's own tokenizer: llama-server's `POST /tokenize` and `POST /apply-template`.

What run/exact_prompt.py cuts prompts of an exact token count with. A server without them raises
`TokenizeUnavailable`, and the caller estimates instead.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

import aiohttp
import yarl

from ..core.baseurl import BaseUrl
from .transport import tls_context


class TokenizeUnavailable(Exception):
    """The server has no usable /tokenize (not llama-server, or an error)."""


class Tokenizer(Protocol):
    async def pieces(self, text: str) -> list[bytes]: ...

    async def template_overhead(self) -> int: ...

    async def count(self, text: str) -> int: ...

    async def specials(self) -> int: ...


class ServerTokenizer:
    """llama-server's POST /tokenize on an open aiohttp session."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str):
        self._session = session
        base = BaseUrl.parse(base_url)
        self._url = yarl.URL(base.url("/tokenize"), encoded=True)
        self._template_url = yarl.URL(base.url("/apply-template"), encoded=True)
        self._specials: int | None = None

    async def _tokenize(self, text: str, *, add_special: bool, with_pieces: bool) -> list[Any]:
        body = {"content": text, "add_special": add_special, "with_pieces": with_pieces}
        try:
            async with self._session.post(self._url, json=body) as resp:
                if resp.status != 200:
                    raise TokenizeUnavailable(f"/tokenize answered HTTP {resp.status}")
                data = json.loads(await resp.read())
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            raise TokenizeUnavailable(f"/tokenize failed ({type(exc).__name__}: {exc})") from None
        tokens = data.get("tokens") if isinstance(data, dict) else None
        if not isinstance(tokens, list):
            raise TokenizeUnavailable("/tokenize gave no token list")
        return tokens

    async def pieces(self, text: str) -> list[bytes]:
        """The text's tokens (no BOS) as byte strings; joined they give the text back."""
        out = []
        for t in await self._tokenize(text, add_special=False, with_pieces=True):
            piece = t.get("piece") if isinstance(t, dict) else None
            if isinstance(piece, str):
                out.append(piece.encode("utf-8"))
            elif isinstance(piece, list):  # bytes of an incomplete UTF-8 sequence
                out.append(bytes(piece))
            else:
                raise TokenizeUnavailable("/tokenize with_pieces gave no pieces")
        return out

    async def count(self, text: str) -> int:
        """Tokens the server computes for this prompt, BOS included when the model adds one."""
        return len(await self._tokenize(text, add_special=True, with_pieces=False))

    async def template_overhead(self) -> int:
        """Tokens the chat template adds around one user message (POST /apply-template)."""
        try:
            one_message = {"messages": [{"role": "user", "content": "x"}]}
            async with self._session.post(self._template_url, json=one_message) as resp:
                if resp.status != 200:
                    raise TokenizeUnavailable(f"/apply-template answered HTTP {resp.status}")
                prompt = json.loads(await resp.read()).get("prompt")
        except (TimeoutError, aiohttp.ClientError, ValueError, AttributeError) as exc:
            raise TokenizeUnavailable(f"/apply-template failed ({type(exc).__name__})") from None
        if not isinstance(prompt, str):
            raise TokenizeUnavailable("/apply-template gave no prompt")
        return await self.count(prompt) - await self.count("x")

    async def specials(self) -> int:
        if self._specials is None:
            with_bos = await self.count("x")
            self._specials = with_bos - len(await self._tokenize("x", add_special=False, with_pieces=False))
        return self._specials


@contextlib.asynccontextmanager
async def server_tokenizer(base_url: str, *, headers: Mapping[str, str] | None = None, timeout_s: float = 120,
                           insecure: bool = False) -> AsyncIterator[ServerTokenizer]:
    """A `ServerTokenizer` on its own aiohttp session to base_url, closed on exit."""
    connector = aiohttp.TCPConnector(ssl=tls_context(insecure) if base_url.startswith("https:") else True)
    async with aiohttp.ClientSession(headers=dict(headers or {}), connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        yield ServerTokenizer(session, base_url)
