"""`loadgen observe`: write a monitoring set for the targets of a run: a prometheus.yml that scrapes
each llama-server's /metrics (with an `alias` label) and loadgen's live metrics, and a Grafana
dashboard that shows both on one time axis.

Targets are labelled as a run labels them (--label, else the server's model alias, else host:port),
so `alias` on the servers' series and `target` on loadgen's carry the same names.
"""

from __future__ import annotations

from pathlib import Path

import click

from ..core.errors import ConfigError
from ..core.prometheus_label import label_value
from ..output.dashboard import DashboardSpec, dashboard_json
from ..output.files import write_files
from ..output.prometheus_config import ScrapeTarget, prometheus_config
from .help import command
from .live import DEFAULT_HOST
from .options import DURATION
from .shared import console, target_options

PROMETHEUS_FILE = "prometheus.yml"
DASHBOARD_FILE = "loadgen-dashboard.json"
DEFAULT_PORT = 9464


@command("observe")
@target_options
@click.option("--prometheus-port", type=click.IntRange(1, 65535), default=DEFAULT_PORT, show_default=True,
              help="The port the run will serve its live metrics on (give the run the same --prometheus-port).")
@click.option("--prometheus-host", default=DEFAULT_HOST, show_default=True,
              help="The address Prometheus reaches loadgen's live metrics at.")
@click.option("--scrape-interval", "scrape_interval_s", type=DURATION, default="5s", show_default=True,
              help="How often Prometheus scrapes every target (as in the first field report: 5s).")
@click.option("--output", default="monitoring", show_default=True, type=click.Path(file_okay=False),
              help="Directory for prometheus.yml and the dashboard JSON.")
@click.option("--force", is_flag=True, help="Overwrite the files of an earlier `loadgen observe` there.")
def observe_command(prometheus_port, prometheus_host, scrape_interval_s, output, force, **target_flags) -> None:
    """Write prometheus.yml and a Grafana dashboard for these targets and loadgen's live metrics."""
    from ..run.config import build_targets
    from ..run.target_setup import label_targets

    # Only the targets matter here (no completion is sent): --api, --model, --transport are unused.
    f = target_flags
    targets = build_targets(f["host"], f["ports"], f["urls"], f["labels"], f["server_urls"])
    api_key, insecure = f["api_key"], f["insecure"]
    out_dir = Path(output)
    existing = [name for name in (PROMETHEUS_FILE, DASHBOARD_FILE) if (out_dir / name).exists()]
    if existing and not force:
        raise ConfigError(f"{out_dir} already holds {' and '.join(existing)}; add --force or choose another --output")
    if scrape_interval_s < 0.1:
        raise ConfigError("--scrape-interval must be at least 100ms")
    err = console(stderr=True)
    named = label_targets(targets, {"Authorization": f"Bearer {api_key}"} if api_key else {}, insecure)
    for t in named:
        if not t.target.label and (t.info is None or t.info.props is None):
            err.print(f"{t.target.url} did not answer /props: labelled {t.label} (give --label to name it)",
                      style="yellow", highlight=False)
        elif t.info is not None and t.info.props is not None and not t.info.metrics_enabled:
            err.print(f"{t.label}: /metrics is off, so its server panels stay empty: start llama-server with "
                      "--metrics", style="yellow", highlight=False)
    loadgen_address = f"{'127.0.0.1' if prometheus_host in ('0.0.0.0', '') else prometheus_host}:{prometheus_port}"
    files = [
        (PROMETHEUS_FILE, prometheus_config([ScrapeTarget(t.label, t.target.probe_url) for t in named], loadgen_address,
                                            scrape_interval_s).encode()),
        (DASHBOARD_FILE, dashboard_json(DashboardSpec(targets=[label_value(t.label) for t in named]))),
    ]
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        written = write_files(files, out_dir)
    except OSError as exc:
        raise ConfigError(f"cannot write to {out_dir} ({exc.strerror}); choose another --output") from None
    for path in written:
        click.echo(str(path))
    err.print(f"next: prometheus --config.file={out_dir / PROMETHEUS_FILE}; a run with --prometheus-port "
              f"{prometheus_port}; import {out_dir / DASHBOARD_FILE} into Grafana", highlight=False)

