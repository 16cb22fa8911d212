"""Live metrics proven against a real Prometheus: two real llama-servers (1 slot and 2), `loadgen
observe`'s prometheus.yml, a `loadgen sweep --prometheus-port`, then Prometheus's HTTP API.

- every query of every panel (and the annotation) of the generated dashboard returns data;
- increase() of loadgen_output_tokens_total over the run equals run.json's output_tokens within one
  scrape's worth, and so does the server's llamacpp:tokens_predicted_total increase (its raw
  samples' difference equals it exactly);
- the 1-slot server's requests_deferred is non-zero while loadgen runs concurrency 3 on it;
- the 2-slot server drafts (ngram-simple): loadgen_spec_decode_acceptance_ratio per level equals
  run.json's acceptance, and the 1-slot server, which does not draft, has no acceptance series;
- with --slo, each level's loadgen_requests_good_total and loadgen_slo_attainment_ratio are run.json's.
"""

from __future__ import annotations

import json
import math
import subprocess
import threading
import time
from pathlib import Path

import pytest

from machine_tree import build_tree, set_energy
from servers import LOADGEN, free_port, prometheus_binary, start_llama_server, start_prometheus

pytestmark = pytest.mark.real

SCRAPE_S = 0.5
RATE_WINDOW = "2s"  # what Grafana's $__rate_interval comes to at this scrape interval: 4 scrapes


def _exprs(dashboard: dict) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every panel target and annotation, Grafana's macros filled in."""
    found = [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p.get("targets", [])]
    found += [(f"annotation {a['name']}", a["expr"]) for a in dashboard["annotations"]["list"] if a.get("expr")]
    return [(title, expr.replace("$__rate_interval", RATE_WINDOW)) for title, expr in found]


def _has_data(result: list[dict]) -> bool:
    return any(math.isfinite(float(v)) for series in result for _, v in series["values"])


def _summed_steps(raw: list[dict]) -> tuple[float, float]:
    """From a range vector's raw samples (every series of one scrape shares its timestamp): the last
    value of their sum, and the largest rise of that sum between two scrapes (from 0 before the first)."""
    totals: dict[float, float] = {}
    for series in raw:
        for t, v in series["values"]:
            totals[float(t)] = totals.get(float(t), 0.0) + float(v)
    steps, previous = [], 0.0
    for t in sorted(totals):
        steps.append(totals[t] - previous)
        previous = totals[t]
    return previous, max(steps, default=0.0)


@pytest.mark.timeout(480)
def test_prometheus_sees_every_panel_and_every_token(tmp_path: Path):
    prometheus_binary()  # skip (locally) or fail (CI) before starting anything
    one = start_llama_server("one-slot", 1, tmp_path)
    # The two-slot server drafts (n-gram speculation, no second model), so the acceptance panel has data
    # and loadgen's live acceptance can be held to run.json's.
    two = start_llama_server("two-slot", 2, tmp_path, extra=("--spec-type", "ngram-simple", "--spec-ngram-simple-size-n",
                                                             "3", "--spec-ngram-simple-size-m", "8"))
    prometheus = None
    try:
        live_port = free_port()
        monitoring = tmp_path / "monitoring"
        observed = subprocess.run([*LOADGEN, "observe", "--url", one.url, "--url", two.url, "--prometheus-port",
                                   str(live_port), "--scrape-interval", f"{SCRAPE_S * 1000:g}ms", "--output",
                                   str(monitoring)], capture_output=True, text=True, timeout=120)
        assert observed.returncode == 0, observed.stderr
        dashboard = json.loads((monitoring / "loadgen-dashboard.json").read_text())
        prometheus = start_prometheus(monitoring / "prometheus.yml", tmp_path)
        prometheus.wait_for("a scrape of both servers", lambda: sorted(
            s["metric"]["alias"] for s in prometheus.query('up{alias!=""} == 1')) == ["one-slot", "two-slot"])

        # A built machine whose RAPL counter draws 20 W, so the energy panels have data (this host may have no RAPL).
        sysfs, procfs = build_tree(tmp_path / "machine", rapl_uj=0)
        drawing = threading.Event()

        def draw() -> None:
            uj = 0
            while not drawing.wait(0.05):
                uj += 1_000_000
                set_energy(sysfs, uj)

        meter = threading.Thread(target=draw, daemon=True)
        meter.start()
        started = time.time()
        run_dir = tmp_path / "run"
        try:
            swept = subprocess.run([*LOADGEN, "sweep", "--url", one.url, "--url", two.url, "--concurrency", "1,3",
                                    "--duration", "5", "--warmup", "0", "--stream", "--n-predict", "16",
                                    "--parallel-targets", "--slo", "ttft=5s,e2e=60s", "--prometheus-port", str(live_port),
                                    "--prometheus-linger", "60", "--sysfs", str(sysfs), "--procfs", str(procfs),
                                    "--env-interval", "0.2", "--output", str(run_dir)],
                                   capture_output=True, text=True, timeout=300)
        finally:
            drawing.set()
            meter.join()
        ended = time.time()
        assert swept.returncode == 0, swept.stderr
        doc = json.loads((run_dir / "run.json").read_text())
        expected = {t["label"]: sum(lv["output_tokens"] for lv in t["levels"]) for t in doc["targets"]}
        assert sorted(expected) == ["one-slot", "two-slot"] and all(expected.values()), expected
        # The sweep lingered until a scrape after its end was answered: Prometheus holds the final counts.
        prometheus.wait_for("loadgen's final counts", lambda: {
            s["metric"]["target"]: float(s["value"][1])
            for s in prometheus.query("sum by (target) (loadgen_output_tokens_total)")} == expected, timeout=30)

        # The live acceptance of each level of the drafting server is run.json's (the same sums), and
        # the server that does not draft has none.
        live_acceptance = {s["metric"]["level"]: float(s["value"][1])
                           for s in prometheus.query('loadgen_spec_decode_acceptance_ratio{target="two-slot"}')}
        two_doc = next(t for t in doc["targets"] if t["label"] == "two-slot")
        # A level that drafted nothing has no acceptance in run.json and no sample live (an n-gram
        # draft needs a repeat in the answer: 16-token answers at c=3 for 5 s may hold none).
        drafted = [lv for lv in two_doc["levels"] if lv.get("acceptance") is not None]
        assert drafted, two_doc["levels"]
        assert live_acceptance.keys() == {str(lv["level"]) for lv in drafted}, (live_acceptance, two_doc["levels"])
        for lv in drafted:
            assert live_acceptance[str(lv["level"])] == pytest.approx(lv["acceptance"]), (lv["level"], live_acceptance)
        assert not prometheus.query('loadgen_spec_decode_acceptance_ratio{target="one-slot"}')
        print(f"two-slot acceptance per level, live and run.json: {live_acceptance}")

        # --slo: each level's live good count and attainment are run.json's (the same judgement).
        for t in doc["targets"]:
            for lv in t["levels"]:
                labels = f'target="{t["label"]}",level="{lv["level"]}"'
                good = prometheus.query(f"loadgen_requests_good_total{{{labels}}}")
                attained = prometheus.query(f"loadgen_slo_attainment_ratio{{{labels}}}")
                assert [float(s["value"][1]) for s in good] == [lv["slo"]["good"]], (labels, good)
                assert [float(s["value"][1]) for s in attained] == [pytest.approx(lv["slo"]["attainment"])]

        window = f"{math.ceil(ended - started) + 10}s"
        for title, expr in _exprs(dashboard):
            result = prometheus.query_range(expr, started, ended, SCRAPE_S)
            assert _has_data(result), f"panel {title!r}: {expr} returned no data"

        for label, tokens in expected.items():
            raw = prometheus.query(f'loadgen_output_tokens_total{{target="{label}"}}[{window}]', at=ended)
            last, scrape_worth = _summed_steps(raw)
            assert last == tokens
            increase = sum(float(s["value"][1]) for s in prometheus.query(
                f'increase(loadgen_output_tokens_total{{target="{label}"}}[{window}])', at=ended))
            assert abs(increase - tokens) <= scrape_worth, (label, increase, tokens, scrape_worth)

            server_raw = prometheus.query(f'llamacpp:tokens_predicted_total{{alias="{label}"}}[{window}]', at=ended)
            values = [float(v) for _, v in server_raw[0]["values"]]
            assert values[-1] - values[0] == tokens  # the server counted what loadgen counted
            server_steps = max(b - a for a, b in zip(values, values[1:]))
            server_increase = float(prometheus.query(
                f'increase(llamacpp:tokens_predicted_total{{alias="{label}"}}[{window}])', at=ended)[0]["value"][1])
            assert abs(server_increase - tokens) <= server_steps, (label, server_increase, tokens)
            print(f"{label}: run.json {tokens} tokens; loadgen increase() {increase:.1f} (one scrape's worth "
                  f"{scrape_worth:g}); server increase() {server_increase:.1f} (one scrape's worth {server_steps:g})")

        # While loadgen ran 3 requests at a time on the 1-slot server, the server deferred some.
        deferred = prometheus.query(
            f'max_over_time((llamacpp:requests_deferred{{alias="one-slot"}} '
            f'and on() (loadgen_level{{target="one-slot"}} == 3))[{window}:{SCRAPE_S * 1000:g}ms])', at=ended)
        assert deferred and float(deferred[0]["value"][1]) >= 1, deferred
    finally:
        if prometheus is not None:
            prometheus.stop()
        one.stop()
        two.stop()
