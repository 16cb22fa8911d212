"""`loadgen observe`: the dashboard against Grafana's dashboard model and the series that exist, the
prometheus.yml, and the command against simulators. (A real Prometheus runs every panel's query in
test_live_metrics_real.py; no Grafana build installs here, see docs/observe.md.)"""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from loadgen.output.dashboard import DATASOURCE_VARIABLE, PANELS, DashboardSpec, dashboard
from loadgen.output.prometheus_config import ScrapeTarget, prometheus_config
from servers import SimThread, in_process_cli, refused_port
from test_live_metrics import _fed, _judged_fed, _samples

# dashboard() imports the SDK when called, so the module loads without it; its tests cannot run.
pytest.importorskip("grafana_foundation_sdk", reason="pip install 'loadgen[grafana]' (the dev extra has it)")
yaml = pytest.importorskip("yaml", reason="pyyaml reads prometheus.yml back (the dev extra has it)")

# The series llama-server emits today (the shared llama-server notes, /metrics section).
LLAMA_SERVER_SERIES = {
    "llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total", "llamacpp:prompt_seconds_total",
    "llamacpp:tokens_predicted_total", "llamacpp:tokens_predicted_seconds_total", "llamacpp:n_decode_total",
    "llamacpp:n_tokens_max", "llamacpp:prompt_tokens_seconds", "llamacpp:predicted_tokens_seconds",
    "llamacpp:requests_processing", "llamacpp:requests_deferred", "llamacpp:n_busy_slots_per_decode",
}
# The field report's six panels, rebuilt on series that exist.
FIELD_REPORT_PANELS = ["Requests processing vs deferred", "Generated tokens/s", "Prompt tokens/s",
                       "Seconds per token", "Batching: busy slots per decode", "Decode calls/s"]
LOADGEN_PANELS = ["Throughput per target (loadgen)", "Latency percentiles", "Queue wait", "Errors by kind",
                  "In flight vs slots", "Level"]
NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
PROMQL_WORDS = {"rate", "sum", "by", "le", "target", "error_kind", "source", "histogram_quantile", "changes", "and",
                "on", "max_over_time", "increase"}


@pytest.fixture(scope="module")
def board() -> dict:
    return dashboard(DashboardSpec(targets=["moe", "dense"]))


def _queries(board: dict) -> list[str]:
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    return exprs + [a["expr"] for a in board["annotations"]["list"] if a.get("expr")]


def test_the_dashboard_follows_grafanas_model(board):
    assert isinstance(board["schemaVersion"], int) and board["schemaVersion"] >= 36
    assert board["uid"] and board["title"]
    variables = board["templating"]["list"]
    assert [(v["type"], v["name"], v["query"]) for v in variables] == [("datasource", DATASOURCE_VARIABLE, "prometheus")]
    source = {"type": "prometheus", "uid": f"${{{DATASOURCE_VARIABLE}}}"}
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in board["panels"]:
        pos = p["gridPos"]
        assert all(isinstance(pos[k], int) for k in ("h", "w", "x", "y")) and pos["x"] + pos["w"] <= 24
        mine = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not cells & mine, f"panel {p['title']!r} overlaps another"
        cells |= mine
        if p["type"] == "row":
            continue
        assert p["type"] == "timeseries" and p["datasource"] == source and p["description"]
        refs = [t["refId"] for t in p["targets"]]
        assert p["targets"] and len(refs) == len(set(refs)) and all(t["expr"] for t in p["targets"])
    assert all(a["datasource"] == source for a in board["annotations"]["list"])
    json.dumps(board)  # plain JSON, importable as it is


def test_the_dashboard_has_the_field_reports_panels_side_by_side_and_loadgens_own(board):
    titles = [p["title"] for p in board["panels"] if p["type"] == "timeseries"]
    assert set(FIELD_REPORT_PANELS + LOADGEN_PANELS) <= set(titles)
    for p in board["panels"]:  # both servers in every server panel: one series per alias
        if p["title"] in FIELD_REPORT_PANELS:
            assert all("{{alias}}" in t["legendFormat"] for t in p["targets"])


def test_every_series_the_dashboard_asks_for_exists(board):
    """No dead panels: llama-server's names are those it emits today (no kv_cache_*), loadgen's are
    those a fed LiveMetrics exposes; no rate is taken of a gauge a scrape resets."""
    exported = {name for name, _ in _samples(_fed())} | {name for name, _ in _samples(_judged_fed())}
    for expr in _queries(board):
        names = {n for n in NAME.findall(re.sub(r'"[^"]*"|\[[^]]*\]|\{[^}]*\}', "", expr))
                 if n not in PROMQL_WORDS and not re.fullmatch(r"[\d.]+", n)}
        assert names, expr
        for name in names:
            if name.startswith("llamacpp:"):
                assert name in LLAMA_SERVER_SERIES, f"{expr}: llama-server has no {name}"
                assert not name.endswith("_tokens_seconds"), f"{expr}: a per-scrape gauge every scraper resets"
            else:
                assert name in exported, f"{expr}: loadgen exports no {name}"
    assert len(PANELS) >= 12


@pytest.mark.parametrize("interval_s, text", [(5, "5s"), (0.5, "500ms"), (0.25, "250ms"), (1.5, "1500ms"), (60, "60s")])
def test_prometheus_yml_scrapes_each_server_with_its_alias_and_loadgen(interval_s, text):
    config = yaml.safe_load(prometheus_config(
        [ScrapeTarget("moe", "http://127.0.0.1:8080"), ScrapeTarget("dense", "https://gpu.example:8443/llama/")],
        "127.0.0.1:9464", interval_s))
    assert config["global"]["scrape_interval"] == text
    jobs = {tuple(j["static_configs"][0]["targets"]): j for j in config["scrape_configs"]}
    assert jobs[("127.0.0.1:8080",)]["static_configs"][0]["labels"] == {"alias": "moe"}
    assert (jobs[("127.0.0.1:8080",)]["scheme"], jobs[("127.0.0.1:8080",)]["metrics_path"]) == ("http", "/metrics")
    dense = jobs[("gpu.example:8443",)]
    assert (dense["scheme"], dense["metrics_path"], dense["static_configs"][0]["labels"]) == \
        ("https", "/llama/metrics", {"alias": "dense"})
    assert jobs[("127.0.0.1:9464",)]["job_name"] == "loadgen"
    assert len({j["job_name"] for j in config["scrape_configs"]}) == 3


def test_promtool_accepts_the_config(tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (apt-get install -y prometheus)")
    path = tmp_path / "prometheus.yml"
    path.write_text(prometheus_config([ScrapeTarget("a b", "http://127.0.0.1:1")], "127.0.0.1:2", 0.5))
    checked = subprocess.run([promtool, "check", "config", str(path)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_observe_labels_servers_as_a_run_does(monkeypatch, capsys, tmp_path):
    run = in_process_cli(monkeypatch, capsys)
    with SimThread(slots=1) as sim, refused_port() as dead:
        code, out, err = run("observe", "--url", sim.url, "--url", f"http://127.0.0.1:{dead}",
                             "--prometheus-port", "9999", "--output", tmp_path)
    assert code == 0, err
    config = yaml.safe_load((tmp_path / "prometheus.yml").read_text())
    aliases = [j["static_configs"][0].get("labels", {}).get("alias") for j in config["scrape_configs"]]
    assert aliases == ["smoke-sim", f"127.0.0.1:{dead}", None]  # the model alias, host:port, then loadgen
    assert f"127.0.0.1:{dead} did not answer /props: labelled 127.0.0.1:{dead}" in " ".join(err.split())
    board = json.loads((tmp_path / "loadgen-dashboard.json").read_text())
    assert "smoke-sim" in board["description"]
    assert out.split() == [str(tmp_path / "prometheus.yml"), str(tmp_path / "loadgen-dashboard.json")]


def test_observe_says_when_a_server_hides_its_metrics(monkeypatch, capsys, tmp_path):
    run = in_process_cli(monkeypatch, capsys)
    with SimThread(slots=1, metrics=False) as sim:
        code, _, err = run("observe", "--url", sim.url, "--label", "quiet", "--output", tmp_path)
    assert code == 0, err
    assert "quiet: /metrics is off, so its server panels stay empty: start llama-server with --metrics" in \
        " ".join(err.split())


def test_observe_does_not_overwrite_without_force(monkeypatch, capsys, tmp_path):
    run = in_process_cli(monkeypatch, capsys)
    (tmp_path / "prometheus.yml").write_text("mine\n")
    code, _, err = run("observe", "--url", "http://127.0.0.1:1", "--label", "x", "--output", tmp_path)
    assert code == 2
    assert err.strip().splitlines() == [f"loadgen: error: {tmp_path} already holds prometheus.yml; "
                                        "add --force or choose another --output"]
    assert (tmp_path / "prometheus.yml").read_text() == "mine\n"
