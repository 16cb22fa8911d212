"""The `prometheus.yml` `loadgen observe` writes: each llama-server's `/metrics` with an `alias`
label (the target's label in loadgen), and loadgen's own live-metrics endpoint.

Written as YAML by hand (every string JSON-quoted, which YAML reads as it is), so no YAML library
is needed. One scrape job per server, because servers behind a gateway differ in path and scheme.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..core.baseurl import BaseUrl
from ..core.prometheus_label import label_value

LOADGEN_JOB = "loadgen"


@dataclass(frozen=True)
class ScrapeTarget:
    alias: str  # the target's label: `alias` on its series, `target` on loadgen's
    url: str  # the server's base URL, as loadgen is given it


def _q(text: str) -> str:
    return json.dumps(text)


def _duration(seconds: float) -> str:
    """Prometheus durations take integers with a unit: 5 -> "5s", 0.5 -> "500ms"."""
    ms = round(seconds * 1000)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def _job_name(alias: str, netloc: str) -> str:
    return f"llama-server {netloc}" if alias == netloc else f"llama-server {alias} ({netloc})"


def prometheus_config(servers: list[ScrapeTarget], loadgen_address: str, scrape_interval_s: float = 5.0) -> str:
    """The configuration text. `loadgen_address` is host:port of `--prometheus-port`."""
    interval = _duration(scrape_interval_s)
    lines = [
        "# Written by `loadgen observe`: llama-server /metrics (alias = loadgen's target label) and",
        "# loadgen's live metrics (--prometheus-port). Start: prometheus --config.file=prometheus.yml",
        "global:",
        f"  scrape_interval: {_q(interval)}",
        f"  evaluation_interval: {_q(interval)}",
        "scrape_configs:",
    ]
    for server in servers:
        parts = urlsplit(server.url)
        path = urlsplit(BaseUrl.parse(server.url).url("/metrics")).path  # under its prefix; a /v1 base is the OpenAI one
        lines += [
            f"  - job_name: {_q(_job_name(server.alias, parts.netloc))}",
            f"    scheme: {_q(parts.scheme or 'http')}",
            f"    metrics_path: {_q(path)}",
            "    static_configs:",
            f"      - targets: [{_q(parts.netloc)}]",
            f"        labels: {{alias: {_q(label_value(server.alias))}}}",
        ]
    lines += [
        f"  - job_name: {_q(LOADGEN_JOB)}",
        "    static_configs:",
        f"      - targets: [{_q(loadgen_address)}]",
    ]
    return "\n".join(lines) + "\n"
