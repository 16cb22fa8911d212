"""A server's base URL, as users write it for servers behind gateways, and how request paths join it.

A base URL may carry a path prefix (a gateway's route, `https://gw.example/team-a/llama`) and a query
string (`?api-version=2024-06-01`, which some gateways want on every request). Every request path —
the completion endpoints and the management ones (`/health`, `/props`, `/slots`, `/metrics`,
`/tokenize`) — goes under the prefix, and the query is appended to each.

A base URL whose path ends in `/v1` follows the OpenAI convention (`http://localhost:8000/v1` is what
an OpenAI SDK user has in their config): `/v1` names the OpenAI API under the server's root, so the
root is the path without it, and `/v1/chat/completions` is sent to `<root>/v1/chat/completions`, never
`/v1/v1/...`. llama-server's own paths (`/completion`, `/health`, ...) go to the root.

Query values that look like keys (`key`, `api_key`, `subscription-key`, `token`, `sig`, ...) are
masked ("***") wherever the URL is shown.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

OPENAI_SUFFIX = "/v1"
MASK = "***"
# Query parameter names whose values are secrets: names ending in one of these words.
_SECRET_NAME = re.compile(r"(?:^|[_\-.])(?:key|apikey|token|secret|password|passwd|pwd|sig|signature|auth|"
                          r"authorization|credential|credentials|code)$", re.IGNORECASE)
# Paths of endpoints, given by mistake where the base URL belongs.
_ENDPOINTS = ("/completion", "/completions", "/chat/completions")
# Characters kept as they are in a path or query (RFC 3986 pchar plus "/" and "?", and "%" escapes).
_SAFE = "/?:@!$&'()*+,;=-._~%"


class BaseUrlError(ValueError):
    """Why a text is not a usable base URL, in one sentence for the user."""


@dataclass(frozen=True, slots=True)
class BaseUrl:
    scheme: str  # http or https
    netloc: str  # host[:port] as given
    root: str  # the server's root path: "" or "/a/b" (no trailing slash, no /v1 suffix)
    query: str  # kept query string, without "?"
    openai_suffix: bool = False  # the given path ended in /v1

    @classmethod
    def parse(cls, text: str) -> BaseUrl:
        """The base URL in `text`; BaseUrlError when it cannot be one."""
        try:
            parts = urlsplit(text.strip())
            parts.port  # noqa: B018 - raises ValueError for a bad port
        except ValueError:
            raise BaseUrlError("not a valid URL (check the host and the port, 1-65535)") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise BaseUrlError("expected http://HOST:PORT or https://HOST:PORT, optionally with a path")
        if parts.username or parts.password:
            raise BaseUrlError("credentials in the URL are not supported; use an API key")
        if parts.port == 0:
            raise BaseUrlError("port 0 is not a server's port")
        if parts.fragment:
            raise BaseUrlError("a base URL has no #fragment")
        if any(c.isspace() for c in parts.path + parts.query):
            raise BaseUrlError("the path or query holds a space; percent-encode it (%20)")
        path = quote(parts.path, safe=_SAFE).rstrip("/")
        if path.endswith(_ENDPOINTS):
            raise BaseUrlError("that is an endpoint, not a base URL: leave out /completion, "
                               "/v1/completions or /v1/chat/completions")
        suffix = path == OPENAI_SUFFIX or path.endswith(OPENAI_SUFFIX)
        root = path[: -len(OPENAI_SUFFIX)] if suffix else path
        return cls(parts.scheme, parts.netloc, root, quote(parts.query, safe=_SAFE), suffix)

    @property
    def origin(self) -> str:
        return f"{self.scheme}://{self.netloc}"

    def target(self, path: str) -> str:
        """The request-target (what follows the method in an HTTP request line) for a server path
        such as "/completion" or "/slots?fail_on_no_slot=1": root + path + the kept query."""
        if not self.query:
            return self.root + path
        return f"{self.root}{path}{'&' if '?' in path else '?'}{self.query}"

    def url(self, path: str) -> str:
        """The absolute URL of a server path."""
        return self.origin + self.target(path)

    def text(self, *, masked: bool = True, scheme: bool = True) -> str:
        """The base URL as given (normalised), its key-like query values masked unless asked not to."""
        path = self.root + (OPENAI_SUFFIX if self.openai_suffix else "")
        query = mask_query(self.query) if masked else self.query
        head = self.origin if scheme else self.netloc
        return head + path + (f"?{query}" if query else "")

    def secrets(self) -> tuple[str, ...]:
        """The query's key-like values, to be masked wherever they appear."""
        return tuple(value for name, value in _pairs(self.query) if value and _SECRET_NAME.search(name))


def masked(text: str) -> str:
    """Any URL text (valid or not) with its key-like query values masked, for messages."""
    head, mark, query = text.partition("?")
    return head + mark + mask_query(query) if mark else head


def mask_query(query: str) -> str:
    """The query string with the values of key-like parameters replaced by "***"."""
    return "&".join(f"{name}={MASK}" if value and _SECRET_NAME.search(name) else
                    (f"{name}={value}" if has_value else name)
                    for name, value, has_value in _pairs_with_equals(query))


def _pairs(query: str) -> list[tuple[str, str]]:
    return [(name, value) for name, value, _ in _pairs_with_equals(query)]


def _pairs_with_equals(query: str) -> list[tuple[str, str, bool]]:
    out = []
    for item in query.split("&") if query else []:
        name, eq, value = item.partition("=")
        out.append((name, value, bool(eq)))
    return out
