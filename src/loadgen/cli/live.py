"""`--prometheus-port` and its companions, for every command that runs for long (sweep, soak, and
through them `run`): the options, defined once, and `serving_live_metrics`, which serves
`LiveMetrics` for the length of a command and lingers for the last scrape."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

import click
from rich.console import Console

from ..analysis.slo import Slo
from ..core.signals import LATCH
from ..run.live import DEFAULT_LINGER_S

if TYPE_CHECKING:
    from ..run.live.endpoint import LiveEndpoint
    from ..run.live.metrics import LiveMetrics

DEFAULT_HOST = "127.0.0.1"


def prometheus_options(f: Callable) -> Callable:
    """--prometheus-port, --prometheus-host, --prometheus-linger."""
    for option in reversed([
        click.option("--prometheus-port", type=click.IntRange(1, 65535),
                     help="Serve loadgen's live metrics for Prometheus on this port while the run goes on "
                          "(see `loadgen observe`)."),
        click.option("--prometheus-host", default=DEFAULT_HOST, show_default=True,
                     help="Address the live metrics listen on (0.0.0.0: every interface)."),
        click.option("--prometheus-linger", "prometheus_linger_s", type=click.FloatRange(min=0),
                     default=DEFAULT_LINGER_S, show_default=True,
                     help="After the run, keep the live metrics up until they are scraped once more, "
                          "at most this many seconds."),
    ]):
        f = option(f)
    return f


@contextlib.contextmanager
def serving_live_metrics(port: int | None, host: str, linger_s: float, levels: Iterable[int | float],
                         err: Console, slo: Slo | None = None) -> Iterator[LiveMetrics | None]:
    """Yield the run's `LiveMetrics` served on `host:port` (None without a port), judging every
    request against `slo` when the run has one. When the block ends
    normally, wait for one more scrape (at most `linger_s`, cut short by a signal), then stop."""
    from ..run.live.endpoint import LiveEndpoint
    from ..run.live.metrics import LiveMetrics

    if port is None:
        yield None
        return
    live = LiveMetrics(levels, slo)
    with LiveEndpoint(live, port, host, linger_s) as endpoint:
        err.print(f"live metrics for Prometheus: {endpoint.url}", highlight=False)
        try:
            yield live
        except SystemExit:  # a command that ends with its exit code: the run is over all the same
            _linger(endpoint, err)
            raise
        _linger(endpoint, err)


def _linger(endpoint: LiveEndpoint, err: Console) -> None:
    if endpoint.linger_s > 0 and not LATCH.received:
        err.print(f"keeping {endpoint.url} up for its last scrape (at most {endpoint.linger_s:g} s)",
                  highlight=False)
        endpoint.linger(give_up=lambda: bool(LATCH.received))
