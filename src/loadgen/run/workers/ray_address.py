"""Where the Ray cluster of `--ray [ADDRESS]` is, checked before Ray is imported.

Addresses: `auto` (the cluster `ray start` runs here), `HOST:PORT` (a head's GCS) or
`ray://HOST[:PORT]` (Ray Client, port 10001). Anything else is refused by `ray_endpoint` before Ray is
imported (Ray would take `bogus://x` for a module named bogus). Before a run, `reach_ray` opens one
TCP connection to the head with a short timeout: Ray itself retries an address that does not answer
for minutes, printing every retry.

Apart from ray_actors.py (the actors, which need the worker pool and so the engine) so that the
`--ray` flag and its check load neither: `loadgen sweep --help` reads RAY_INSTALL from here.
"""

from __future__ import annotations

import socket
import urllib.parse
from typing import Any

from ...core.errors import ConfigError

RAY_INSTALL = "pip install 'loadgen[ray]'"
LOCAL = "local"  # --ray without an address: a cluster of this machine, for this run
AUTO = "auto"  # the cluster `ray start` runs on this machine, as Ray finds it
RAY_CLIENT_PORT = 10001  # ray://HOST without a port
RAY_CONNECT_TIMEOUT_S = 5.0  # for the head to accept a TCP connection, before Ray is asked to connect
_ADDRESS_HELP = "give HOST:PORT (a head's, e.g. 10.0.0.5:6379), ray://HOST:10001, auto, or --ray alone for a local cluster"


def ray_endpoint(address: str) -> tuple[str, int] | None:
    """The (host, port) an --ray address connects to; None for `local` and `auto` (no address to
    check yet). A ConfigError in one line for anything that is not an address Ray takes."""
    if address in (LOCAL, AUTO):
        return None
    if not address.isprintable() or " " in address:  # urlsplit would drop a newline or tab Ray would keep
        raise ConfigError(f"--ray {address!r} is not a Ray address; {_ADDRESS_HELP}")
    scheme, sep, rest = address.partition("://")
    if not sep:
        scheme, rest = "", address
    elif scheme != "ray":
        raise ConfigError(f"--ray {address!r}: {scheme or 'an empty'} scheme is not Ray's; {_ADDRESS_HELP}")
    try:
        parts = urllib.parse.urlsplit("//" + rest)
        host, port = parts.hostname, parts.port
    except ValueError:
        host = port = None
    if port is None and scheme == "ray":
        port = RAY_CLIENT_PORT
    if not host or not port or parts.path or parts.query or parts.fragment or parts.username is not None:
        raise ConfigError(f"--ray {address!r} is not a Ray address; {_ADDRESS_HELP}")
    return host, port


def reach_ray(address: str, ray: Any, timeout_s: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """A ConfigError in one line unless the head at `address` accepts a TCP connection within
    `timeout_s` (`auto`: the address Ray finds, or that it finds none); `local` needs no check."""
    endpoint = ray_endpoint(address)
    if address == AUTO:
        endpoint = _auto_endpoint(ray)
    if endpoint is None:
        return
    host, port = endpoint
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except TimeoutError:
        raise ConfigError(f"--ray {address}: no answer from {host}:{port} within {timeout_s:g} s; "
                          "is the Ray head running there (ray start --head)?") from None
    except OSError as exc:
        raise ConfigError(f"--ray {address}: nothing answers at {host}:{port} ({exc.strerror or exc}); "
                          "is the Ray head running there (ray start --head)?") from None


def _auto_endpoint(ray: Any) -> tuple[str, int] | None:
    """The head `ray.init(address="auto")` would connect to, found as Ray finds it (RAY_ADDRESS, the
    last `ray start`); None when this Ray has no such function (ray.init then finds it itself)."""
    try:
        from ray._private.services import canonicalize_bootstrap_address
    except ImportError:
        return None
    try:
        found = canonicalize_bootstrap_address(AUTO)
    except ConnectionError:
        raise ConfigError("--ray auto: no running Ray cluster on this machine; start one (ray start --head) "
                          "or give its address") from None
    except Exception as exc:  # noqa: BLE001 - RAY_ADDRESS or Ray's own file holds something that is no address
        raise ConfigError(f"--ray auto: Ray found no usable address ({first_line(exc)})") from None
    return ray_endpoint(found) if found else None


def first_line(exc: BaseException) -> str:
    """An exception's first line, at most 200 characters: what a one-line error quotes of Ray's."""
    return (str(exc) or type(exc).__name__).splitlines()[0][:200]


def import_ray() -> Any:
    """The `ray` module, or a ConfigError that says how to install it."""
    try:
        import ray
    except ImportError:
        raise ConfigError(f"--ray needs Ray, which is not installed: {RAY_INSTALL}") from None
    return ray
