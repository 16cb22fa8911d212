"""Which transports there are, and which one a target gets: the one neutral place that names them.

Like uvicorn's `HTTP_PROTOCOLS`, each name maps to an import string, imported only when a transport
is made: asking for the names (the `--transport` option) loads neither aiohttp nor httptools.
"""

from __future__ import annotations

import importlib
import ipaddress
import urllib.request
from collections.abc import Callable
from urllib.parse import urlsplit

from .transport import Transport

TRANSPORTS = {
    "fast": "loadgen.client.fast:FastTransport",
    "aiohttp": "loadgen.client.aiohttp_transport:AiohttpTransport",
}
TRANSPORT_NAMES = tuple(TRANSPORTS)


def transport_class(name: str) -> type:
    """The class behind a transport name (imported now)."""
    if name not in TRANSPORTS:
        raise ValueError(f"unknown transport {name!r}")
    module, _, attr = TRANSPORTS[name].partition(":")
    return getattr(importlib.import_module(module), attr)


def environment_proxy(url: str) -> str | None:
    """The proxy the environment (http_proxy, https_proxy, all_proxy, no_proxy) sets for `url`.

    Loopback targets are never proxied, whatever the environment says.
    """
    parts = urlsplit(url)
    host = parts.hostname or ""
    if host == "localhost" or host.endswith(".localhost"):
        return None
    try:
        if ipaddress.ip_address(host).is_loopback:
            return None
    except ValueError:
        pass
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if not proxy or urllib.request.proxy_bypass_environment(host, proxies):  # type: ignore[attr-defined]  # in urllib.request, not in typeshed
        return None
    return proxy

def make_transport(name: str, url: str, say: Callable[[str], None] | None = None) -> Transport:
    """The transport called `name` for `url`; the fast one falls back to aiohttp behind a proxy."""
    proxy = environment_proxy(url)
    if name == "aiohttp":
        return transport_class("aiohttp")(proxy=proxy)
    if name != "fast":
        raise ValueError(f"unknown transport {name!r}")
    if proxy is not None:
        if say is not None:
            say(f"{urlsplit(url).netloc}: using the aiohttp transport, because the environment sets a proxy "
                f"for it ({_without_credentials(proxy)}) and the fast transport does not speak to proxies")
        return transport_class("aiohttp")(proxy=proxy)
    return transport_class("fast")()

def _without_credentials(proxy: str) -> str:
    parts = urlsplit(proxy)
    return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl() if parts.netloc else proxy
