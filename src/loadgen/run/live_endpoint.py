"""The HTTP endpoint that serves `LiveMetrics` to Prometheus (`--prometheus-port`).

prometheus_client's own server, in threads of its own: a scrape never runs on the event loop. It
listens on loopback unless told otherwise. After the run it stays up until a scrape that began after
the run's end has read the final counts, or `linger_s` has passed, whichever comes first.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import Metric

from ..core.errors import ConfigError
from .live_metrics import LiveMetrics

DEFAULT_LINGER_S = 15.0


class _CountingCollector:
    """Counts the scrapes that began, for the linger."""

    def __init__(self, live: LiveMetrics):
        self.live = live
        self.scrapes = 0
        self.scraped = threading.Condition()

    def collect(self) -> Iterator[Metric]:
        with self.scraped:
            self.scrapes += 1
            self.scraped.notify_all()
        return self.live.collect()


class LiveEndpoint:
    """`with LiveEndpoint(live, port) as endpoint:` ... `endpoint.linger()` after the run."""

    def __init__(self, live: LiveMetrics, port: int, host: str = "127.0.0.1", linger_s: float = DEFAULT_LINGER_S):
        self.live, self.port, self.host, self.linger_s = live, port, host, linger_s
        self._collector = _CountingCollector(live)
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    @property
    def scrapes(self) -> int:
        return self._collector.scrapes

    def __enter__(self) -> "LiveEndpoint":
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self._collector)  # type: ignore[arg-type]
        try:
            self._server, self._thread = start_http_server(self.port, addr=self.host, registry=registry)
        except OSError as exc:
            raise ConfigError(f"--prometheus-port {self.port}: cannot listen on {self.host}:{self.port} "
                              f"({exc.strerror or exc}); choose another port") from None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)

    def linger(self, give_up: Callable[[], bool] = lambda: False) -> bool:
        """Wait until a scrape begins after now, at most `linger_s`, or until `give_up()` (polled every
        0.1 s, e.g. a Ctrl-C). True when a scrape came."""
        deadline = time.monotonic() + self.linger_s
        collector = self._collector
        with collector.scraped:
            seen = collector.scrapes
            while collector.scrapes == seen:
                left = deadline - time.monotonic()
                if left <= 0 or give_up():
                    return False
                collector.scraped.wait(min(left, 0.1))
        return True
