"""The HTTP endpoint that serves `LiveMetrics` to Prometheus (`--prometheus-port`).

prometheus_client's WSGI app on a threading WSGI server of our own: every scrape is answered in a
thread of its own, never on the event loop. It listens on loopback unless told otherwise. After the
run it stays up until a scrape that began after the run's end has been answered in full (so the
final counts were read), or `linger_s` has passed, whichever comes first.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from ...core.errors import ConfigError
from ...core.prometheus_label import label_value
from . import DEFAULT_LINGER_S

if TYPE_CHECKING:  # the endpoint serves the LiveMetrics it is given: it needs only their type
    from .metrics import LiveMetrics

DRAIN_EVERY_S = 1.0  # the records a run queues are counted at least this often, scraped or not


class _Collector(Collector):  # an ABC in older prometheus_client, a Protocol in newer: subclassing suits both
    def __init__(self, live: LiveMetrics):
        self.live = live

    def collect(self) -> Iterator[Metric]:
        """The live metrics, each `target` label value made typeable (`core.prometheus_label`)."""
        for metric in self.live.collect():
            metric.samples = [s._replace(labels={**s.labels, "target": label_value(s.labels["target"])})
                              if "target" in s.labels else s for s in metric.samples]
            yield metric


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # no line per scrape on stderr
        pass


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _ThreadingServer6(_ThreadingServer):
    address_family = socket.AF_INET6


class _Answered:
    """A WSGI body that reports when the server has written it all (WSGI servers call close())."""

    def __init__(self, body: Iterable[bytes], on_close: Callable[[], None]):
        self._body, self._on_close = body, on_close

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._body)

    def close(self) -> None:
        self._on_close()


class LiveEndpoint:
    """`with LiveEndpoint(live, port) as endpoint:` ... `endpoint.linger()` after the run."""

    def __init__(self, live: LiveMetrics, port: int, host: str = "127.0.0.1", linger_s: float = DEFAULT_LINGER_S):
        self.live, self.port, self.host, self.linger_s = live, port, host, linger_s
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(live))
        self._metrics_app = make_wsgi_app(registry)
        self._changed = threading.Condition()
        self.scrapes_begun = 0
        self._answered_up_to = 0  # the highest number of a scrape answered in full
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()
        self._drainer: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def _app(self, environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == "/favicon.ico":
            return self._metrics_app(environ, start_response)
        with self._changed:
            self.scrapes_begun += 1
            number = self.scrapes_begun
        return _Answered(self._metrics_app(environ, start_response), lambda: self._answered(number))

    def _answered(self, number: int) -> None:
        with self._changed:
            self._answered_up_to = max(self._answered_up_to, number)
            self._changed.notify_all()

    def __enter__(self) -> LiveEndpoint:
        server_class = _ThreadingServer6 if ":" in self.host else _ThreadingServer
        try:
            self._server = make_server(self.host, self.port, self._app, server_class, handler_class=_QuietHandler)
        except OSError as exc:
            raise ConfigError(f"--prometheus-port {self.port}: cannot listen on {self.host}:{self.port} "
                              f"({exc.strerror or exc}); choose another port") from None
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="loadgen-live-metrics", daemon=True)
        self._thread.start()
        self._drainer = threading.Thread(target=self._drain_until_closed, name="loadgen-live-drain", daemon=True)
        self._drainer.start()
        return self

    def _drain_until_closed(self) -> None:
        """Count the queued records every DRAIN_EVERY_S, so the queue stays short when nobody scrapes."""
        while not self._closing.wait(DRAIN_EVERY_S):
            self.live.drain()

    def __exit__(self, *exc: object) -> None:
        self._closing.set()
        if self._drainer is not None:
            self._drainer.join(5)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)

    def linger(self, give_up: Callable[[], bool] = lambda: False) -> bool:
        """Wait until a scrape that begins after now has been answered, at most `linger_s`, or until
        `give_up()` (polled every 0.1 s, e.g. a Ctrl-C came). True when such a scrape came."""
        deadline = time.monotonic() + self.linger_s
        with self._changed:
            mark = self.scrapes_begun
            while self._answered_up_to <= mark:
                left = deadline - time.monotonic()
                if left <= 0 or give_up():
                    return False
                self._changed.wait(min(left, 0.1))
        return True
