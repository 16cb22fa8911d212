"""Prometheus label values (`target` on loadgen's series, `alias` on llama-server's): loadgen's
display label made easy to type in PromQL: ASCII letters, digits, '_', '.', ':' and '-' only."""

from __future__ import annotations

import pytest

from loadgen.core.prometheus_label import label_value

# display label -> label value (written before the function)
CASES = [
    ("moe", "moe"),
    ("SmolLM2-135M-Instru…Q4_1", "SmolLM2-135M-Instru-Q4_1"),
    ("SmolLM2…Q4_1@8081", "SmolLM2-Q4_1-8081"),
    ("127.0.0.1:8080", "127.0.0.1:8080"),
    ("my model/v2", "my-model-v2"),
    ("qwen#2", "qwen-2"),
    ("…@", "target"),
    ("x" * 80, "x" * 48),
]


@pytest.mark.parametrize("label, expected", CASES)
def test_label_value(label, expected):
    assert label_value(label) == expected


def test_the_live_endpoint_and_prometheus_yml_use_it():
    from loadgen.core.records import LevelRun
    from loadgen.output.prometheus_config import ScrapeTarget, prometheus_config
    from loadgen.run.live.endpoint import _Collector
    from loadgen.run.live.metrics import LiveMetrics

    text = prometheus_config([ScrapeTarget("SmolLM2…Q4_1@8081", "http://127.0.0.1:8081")], "127.0.0.1:9")
    assert 'alias: "SmolLM2-Q4_1-8081"' in text and "…" not in text
    live = LiveMetrics(levels=(1,))
    live.level_started(LevelRun(target="SmolLM2…Q4_1@8081", concurrency=1), 8, None)
    targets = {s.labels["target"] for m in _Collector(live).collect() for s in m.samples if "target" in s.labels}
    assert targets == {"SmolLM2-Q4_1-8081"}
