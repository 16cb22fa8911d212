"""`--prometheus-port`: loadgen's live metrics, without a real server or Prometheus.

Bucket placement and the exposition of a fed `LiveMetrics` are table tests whose answers were
written down first; the endpoint and the CLI run against the simulator.
"""

from __future__ import annotations

import json
import socket
import threading
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from loadgen.core.environment import EnvSample, GpuFacts, RaplZone
from loadgen.core.errors import ConfigError
from loadgen.core.records import LevelRun, ProbeSample, ServerOutcome, make_record
from loadgen.run.live.endpoint import LiveEndpoint
from loadgen.run.live.metrics import Buckets, LiveMetrics
from servers import SimThread, free_port, in_process_cli

MS = 1_000_000


@pytest.mark.parametrize("value, le", [
    (0.0, "0.1"), (0.1, "0.1"), (0.1000001, "0.5"), (0.5, "0.5"), (1.0, "1"), (1.5, "+Inf"),
])
def test_a_value_lands_in_the_first_bucket_whose_bound_it_does_not_exceed(value, le):
    b = Buckets((0.1, 0.5, 1))
    b.add(value)
    cumulative, total = b.cumulative()
    first = next(bound for bound, n in cumulative if n == 1)
    assert first == le
    assert total == value


def test_many_values_go_into_buckets_at_once_negative_ones_as_zero():
    b = Buckets((0.1, 0.5, 1))
    b.add([0, 0.1, 0.100001, -0.000005, 2.0])
    cumulative, total = b.cumulative()
    assert cumulative == [("0.1", 3), ("0.5", 4), ("1", 4), ("+Inf", 5)]
    assert total == pytest.approx(2.200001)


def _samples(live: LiveMetrics) -> dict[tuple[str, frozenset], float]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(live)  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _key(name: str, **labels: str) -> tuple[str, frozenset]:
    return name, frozenset(labels.items())


def _fed() -> LiveMetrics:
    """Target "a" at level 2 of a run with levels 1 and 2: one streamed success, a timeout, an HTTP
    503, one request still in flight, and the probe's last look at two slots."""
    live = LiveMetrics(levels=(1, 2))
    level = LevelRun(target="a", concurrency=2)
    live.level_started(level, 8, None)
    ok = ServerOutcome(predicted_n=10, prompt_ms=100.0, predicted_ms=900.0)
    live.request_done(make_record("a", 2, 0, 0, "s", 0, 1500 * MS, 200, ok, 10 * MS, None, 300 * MS, 1200 * MS,
                                  [10_000, 20_000], 3))
    live.request_done(make_record("a", 2, 1, 1, "s", 0, 600 * MS, None, ServerOutcome(error_kind="timeout")))
    live.request_done(make_record("a", 2, 0, 2, "s", 0, 5 * MS, 503, ServerOutcome(error_kind="http_503")))
    level.in_flight[3] = (1, "s", 0, None)
    level.probe_samples.append(ProbeSample("a", 2, 0, busy_slots=1, slot_context_tokens=[40, 0]))
    # The machine over the level: RAPL package-0 +20 J and GPU 0 +100 J in 2 s (a psys zone overlaps
    # the packages and counts in nothing).
    level.environment += [_machine(10.0, cpu_uj=1_000_000, gpu_mj=0), _machine(12.0, cpu_uj=21_000_000, gpu_mj=100_000)]
    return live


def _machine(at_s: float, cpu_uj: int, gpu_mj: int) -> EnvSample:
    return EnvSample(at_s=at_s, rapl=(RaplZone(zone="intel-rapl:0", name="package-0", energy_uj=cpu_uj,
                                               max_energy_range_uj=None),
                                      RaplZone(zone="intel-rapl:1", name="psys", energy_uj=cpu_uj * 3,
                                               max_energy_range_uj=None)),
                     gpus=(GpuFacts(index=0, name="GPU", energy_mj=gpu_mj),))


# (series, labels, value): written down from the records above before the test was first run.
EXPECTED = [
    ("loadgen_requests_sent_total", dict(target="a", level="2"), 4),
    ("loadgen_requests_sent_total", dict(target="a", level="1"), 0),
    ("loadgen_requests_completed_total", dict(target="a", level="2"), 1),
    ("loadgen_output_tokens_total", dict(target="a", level="2"), 10),
    ("loadgen_output_tokens_total", dict(target="a", level="1"), 0),
    ("loadgen_requests_failed_total", dict(target="a", level="2", error_kind="timeout"), 1),
    ("loadgen_requests_failed_total", dict(target="a", level="2", error_kind="http_503"), 1),
    ("loadgen_requests_failed_total", dict(target="a", level="2", error_kind="disconnected"), 0),
    ("loadgen_requests_failed_total", dict(target="a", level="1", error_kind="timeout"), 0),
    ("loadgen_latency_seconds_bucket", dict(target="a", level="2", le="1"), 0),
    ("loadgen_latency_seconds_bucket", dict(target="a", level="2", le="2"), 1),
    ("loadgen_latency_seconds_count", dict(target="a", level="2"), 1),
    ("loadgen_latency_seconds_sum", dict(target="a", level="2"), 1.5),
    ("loadgen_time_to_first_token_seconds_bucket", dict(target="a", level="2", le="0.2"), 0),
    ("loadgen_time_to_first_token_seconds_bucket", dict(target="a", level="2", le="0.3"), 1),
    ("loadgen_inter_token_latency_seconds_bucket", dict(target="a", level="2", le="0.01"), 1),
    ("loadgen_inter_token_latency_seconds_count", dict(target="a", level="2"), 2),
    ("loadgen_inter_token_latency_seconds_sum", dict(target="a", level="2"), 0.03),
    ("loadgen_queue_wait_seconds_count", dict(target="a", level="2"), 1),
    ("loadgen_queue_wait_seconds_sum", dict(target="a", level="2"), 0.5),
    ("loadgen_requests_in_flight", dict(target="a"), 1),
    ("loadgen_level", dict(target="a"), 2),
    ("loadgen_slots_busy", dict(target="a"), 1),
    ("loadgen_slots_total", dict(target="a"), 2),
    ("loadgen_slot_context_tokens", dict(target="a", slot="0"), 40),
    ("loadgen_slot_context_tokens", dict(target="a", slot="1"), 0),
    # energy over the level's 2 s and its 10 output tokens
    ("loadgen_energy_joules_total", dict(target="a", level="2", source="cpu"), 20),
    ("loadgen_energy_joules_total", dict(target="a", level="2", source="gpu"), 100),
    ("loadgen_energy_joules_total", dict(target="a", level="2", source="total"), 120),
    ("loadgen_power_watts", dict(target="a", level="2", source="cpu"), 10),
    ("loadgen_power_watts", dict(target="a", level="2", source="total"), 60),
    ("loadgen_joules_per_token", dict(target="a", level="2", source="cpu"), 2),
    ("loadgen_joules_per_token", dict(target="a", level="2", source="gpu"), 10),
    ("loadgen_joules_per_token", dict(target="a", level="2", source="total"), 12),
]


def test_a_level_without_two_machine_samples_or_without_tokens_has_no_energy_figure():
    live = LiveMetrics(levels=(1,))
    level = LevelRun(target="a", concurrency=1)
    live.level_started(level, 1, None)
    level.environment.append(_machine(0.0, cpu_uj=0, gpu_mj=0))
    assert not any(name.startswith(("loadgen_energy", "loadgen_power", "loadgen_joules")) for name, _ in _samples(live))
    level.environment.append(_machine(1.0, cpu_uj=5_000_000, gpu_mj=0))  # 5 J, no token yet
    samples = _samples(live)
    assert samples[_key("loadgen_energy_joules_total", target="a", level="1", source="cpu")] == 5
    assert not any(name == "loadgen_joules_per_token" for name, _ in samples)


@pytest.mark.parametrize("name, labels, value", EXPECTED)
def test_the_exposition_counts_what_the_records_say(name, labels, value):
    samples = _samples(_fed())
    assert samples[_key(name, **labels)] == pytest.approx(value)


@pytest.mark.parametrize("record", [
    # closed loop: sent at 0, 1.5 s, server busy 1.0 s -> queue wait 0.5 s
    make_record("a", 1, 0, 0, "s", 0, 1500 * MS, 200, ServerOutcome(predicted_n=4, prompt_ms=100.0, predicted_ms=900.0)),
    # open loop: due 200 ms before it left; the server says it worked longer than the client waited
    make_record("a", 1, 0, 1, "s", 200 * MS, 900 * MS, 200, ServerOutcome(predicted_n=4, prompt_ms=500.0,
                predicted_ms=400.0), None, 0),
    # streamed, no timings: no queue wait
    make_record("a", 1, 0, 2, "s", 10 * MS, 800 * MS, 200, ServerOutcome(predicted_n=4), None, 5 * MS, 60 * MS,
                700 * MS, [1000, 2000], 3),
])
def test_the_live_figures_are_the_analysis_formulas(record):
    from loadgen.analysis.metrics import latency_ms, queue_wait_ms, ttft_ms

    live = LiveMetrics()
    live.request_done(record)
    live.drain()
    s = live.series[("a", "1")]
    assert s.histograms["latency"].total == pytest.approx(latency_ms(record) / 1e3)
    ttft = ttft_ms(record)
    assert (s.histograms["ttft"].total, sum(s.histograms["ttft"].counts)) == ((pytest.approx(ttft / 1e3), 1) if ttft is not None else (0.0, 0))
    wait = queue_wait_ms(record)
    assert (s.histograms["queue_wait"].total, sum(s.histograms["queue_wait"].counts)) == \
        ((pytest.approx(wait / 1e3), 1) if wait is not None else (0.0, 0))


def test_counters_never_fall_while_a_request_moves_from_in_flight_to_answered():
    live = _fed()
    level = live.current["a"]
    before = _samples(live)[_key("loadgen_requests_sent_total", target="a", level="2")]
    level.in_flight.pop(3)  # answered, but request_done not called yet: the sum dips by one
    assert _samples(live)[_key("loadgen_requests_sent_total", target="a", level="2")] == before


def test_the_observer_wrapper_feeds_the_metrics_and_passes_every_call_on():
    calls = []

    class Inner:
        def level_started(self, level, requests, duration_s):
            calls.append("level_started")

        def request_done(self, record):
            calls.append("request_done")

        def message(self, text):
            calls.append(f"message {text}")

    live = LiveMetrics()
    obs = live.observe(Inner())
    obs.level_started(LevelRun(target="b", concurrency=1), 1, None)
    obs.request_done(make_record("b", 1, 0, 0, "s", 0, MS, 200, ServerOutcome(predicted_n=3)))
    obs.message("hi")
    assert calls == ["level_started", "request_done", "message hi"]
    live.drain()
    assert live.series[("b", "1")].output_tokens == 3


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read().decode()


def test_the_endpoint_serves_the_metrics_and_lingers_until_a_later_scrape_is_answered():
    live = _fed()
    port = free_port()
    with LiveEndpoint(live, port, linger_s=60) as endpoint:
        assert 'loadgen_output_tokens_total{level="2",target="a"} 10.0' in _get(endpoint.url)
        stop = threading.Event()

        def scrape_until_stopped() -> None:
            while not stop.is_set():
                _get(endpoint.url)

        scraper = threading.Thread(target=scrape_until_stopped)
        scraper.start()
        try:
            assert endpoint.linger() is True
        finally:
            stop.set()
            scraper.join(10)
    with pytest.raises(urllib.error.URLError):  # closed with the block
        _get(f"http://127.0.0.1:{port}/metrics")


def test_without_a_scraper_the_linger_ends_at_its_limit_or_at_a_signal():
    with LiveEndpoint(LiveMetrics(), free_port(), linger_s=0.2) as endpoint:
        assert endpoint.linger() is False
    with LiveEndpoint(LiveMetrics(), free_port(), linger_s=3600) as endpoint:
        assert endpoint.linger(give_up=lambda: True) is False


def test_a_port_in_use_is_a_config_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"--prometheus-port {port}: cannot listen"):
            LiveEndpoint(LiveMetrics(), port).__enter__()


@pytest.mark.parametrize("command", [
    ("sweep", "--concurrency", "1,3", "--requests", "6", "--stream", "--warmup", "0", "--slo", "ttft=30s,e2e=60s"),
    ("soak", "--concurrency", "2", "--duration", "2s", "--warmup", "0", "--probe-interval", "0.1", "--slo", "e2e=60s"),
])
def test_a_run_with_prometheus_port_shows_its_final_counts_to_the_last_scrape(command, monkeypatch, capsys, tmp_path):
    run = in_process_cli(monkeypatch, capsys)
    port = free_port()
    bodies: list[str] = []
    done = threading.Event()

    def scrape() -> None:
        while not done.is_set():
            try:
                bodies.append(_get(f"http://127.0.0.1:{port}/metrics"))
            except (urllib.error.URLError, ConnectionError, OSError):
                pass

    scraper = threading.Thread(target=scrape)
    with SimThread(slots=2) as sim:
        scraper.start()
        try:
            code, _, err = run(*command, "--url", sim.url, "--label", "sim", "--output", tmp_path / "run",
                               "--prometheus-port", port, "--prometheus-linger", "120")
        finally:
            done.set()
            scraper.join(30)
    assert code == 0, err
    assert f"live metrics for Prometheus: http://127.0.0.1:{port}/metrics" in err
    doc = json.loads((tmp_path / "run" / "run.json").read_text())
    last = {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(bodies[-1]) for s in family.samples}
    levels = doc["targets"][0]["levels"]
    assert levels and all(lv["requests_ok"] for lv in levels)
    for lv in levels:
        level = str(lv["level"])
        assert last[_key("loadgen_requests_completed_total", target="sim", level=level)] == lv["requests_ok"]
        assert last[_key("loadgen_output_tokens_total", target="sim", level=level)] == lv["output_tokens"]
        assert last[_key("loadgen_requests_sent_total", target="sim", level=level)] == lv["requests_ok"]
        # --slo: the live judgement is run.json's (a simulator is well within a minute: all good)
        assert last[_key("loadgen_requests_good_total", target="sim", level=level)] == lv["slo"]["good"] == lv["requests_ok"]
        assert last[_key("loadgen_slo_attainment_ratio", target="sim", level=level)] == lv["slo"]["attainment"] == 1.0
    assert last[_key("loadgen_slots_total", target="sim")] == 2


def test_a_sweep_whose_prometheus_port_is_taken_exits_2_in_one_line(monkeypatch, capsys, tmp_path):
    run = in_process_cli(monkeypatch, capsys)
    with socket.socket() as taken, SimThread(slots=1) as sim:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, _, err = run("sweep", "--url", sim.url, "--concurrency", "1", "--requests", "1",
                           "--output", tmp_path / "run", "--prometheus-port", port)
    assert code == 2
    assert err.strip().splitlines() == [f"loadgen: error: --prometheus-port {port}: cannot listen on "
                                        f"127.0.0.1:{port} (Address already in use); choose another port"]


def test_a_scenario_file_takes_the_prometheus_keys(monkeypatch, capsys, tmp_path):
    run = in_process_cli(monkeypatch, capsys)
    scenario = tmp_path / "soak.toml"
    scenario.write_text('mode = "soak"\nurl = "http://127.0.0.1:1"\nduration = "10s"\n'
                        'prometheus_port = 9464\nprometheus_host = "0.0.0.0"\nprometheus_linger = 5\n')
    code, out, err = run("run", scenario, "--check")
    assert (code, out.strip()) == (0, f"{scenario}: mode soak, 5 keys, all valid"), err
    scenario.write_text('mode = "sweep"\nurl = "http://127.0.0.1:1"\nprometheus_port = 99999\n')
    code, _, err = run("run", scenario, "--check")
    assert code == 2 and "prometheus_port: 99999 is not in the range 1<=x<=65535" in err


def _drafting_fed() -> LiveMetrics:
    """Target "s" at level 1: two successful requests that drafted (40 drafted, 30 accepted) and
    reasoned (12 of 30 output tokens), one that did neither, a failed one that drafted (left out);
    level 2 ran nothing; target "p" at level 1: a request of a server that does not draft."""
    live = LiveMetrics(levels=(1, 2))
    live.level_started(LevelRun(target="s", concurrency=1), 4, None)
    live.level_started(LevelRun(target="p", concurrency=1), 1, None)
    outcomes = [ServerOutcome(predicted_n=10, draft_n=10, draft_n_accepted=8, reasoning_tokens=4),
                ServerOutcome(predicted_n=20, draft_n=30, draft_n_accepted=22, reasoning_tokens=8),
                ServerOutcome(predicted_n=10),
                ServerOutcome(error_kind="http_500", draft_n=50, draft_n_accepted=50, reasoning_tokens=50)]
    for seq, outcome in enumerate(outcomes):
        live.request_done(make_record("s", 1, 0, seq, "x", 0, 100 * MS, 200, outcome))
    live.request_done(make_record("p", 1, 0, 0, "x", 0, 100 * MS, 200, ServerOutcome(predicted_n=10)))
    return live


# (series, labels, value or None for "no sample"): written down from the records above first.
DRAFTING = [
    ("loadgen_spec_decode_num_draft_tokens_total", dict(target="s", level="1"), 40),
    ("loadgen_spec_decode_num_accepted_tokens_total", dict(target="s", level="1"), 30),
    ("loadgen_spec_decode_acceptance_ratio", dict(target="s", level="1"), 0.75),
    ("loadgen_reasoning_tokens_total", dict(target="s", level="1"), 12),
    ("loadgen_reasoning_share_ratio", dict(target="s", level="1"), 12 / 40),  # 40 output tokens of 3 successes
    ("loadgen_spec_decode_num_draft_tokens_total", dict(target="s", level="2"), 0),  # made at 0
    ("loadgen_spec_decode_acceptance_ratio", dict(target="s", level="2"), None),
    ("loadgen_spec_decode_num_draft_tokens_total", dict(target="p", level="1"), 0),
    ("loadgen_spec_decode_acceptance_ratio", dict(target="p", level="1"), None),  # "no speculation", not 0
    ("loadgen_reasoning_share_ratio", dict(target="p", level="1"), None),
    ("loadgen_reasoning_tokens_total", dict(target="p", level="1"), 0),
]


@pytest.mark.parametrize("name, labels, value", DRAFTING)
def test_acceptance_and_reasoning_share_are_served_live(name, labels, value):
    samples = _samples(_drafting_fed())
    if value is None:
        assert _key(name, **labels) not in samples
    else:
        assert samples[_key(name, **labels)] == pytest.approx(value)


def test_the_live_acceptance_and_share_are_the_level_summarys():
    from loadgen.analysis.aggregate import summarize_level

    records = [make_record("s", 1, 0, seq, "x", 0, 100 * MS, 200, o) for seq, o in enumerate([
        ServerOutcome(predicted_n=7, draft_n=9, draft_n_accepted=2, reasoning_tokens=3),
        ServerOutcome(predicted_n=5, draft_n=1, draft_n_accepted=1)])]
    fresh = LiveMetrics()
    fresh.requests_done(records)
    samples = _samples(fresh)
    summary = summarize_level(1, records)
    assert samples[_key("loadgen_spec_decode_acceptance_ratio", target="s", level="1")] == pytest.approx(summary.acceptance)
    assert samples[_key("loadgen_reasoning_share_ratio", target="s", level="1")] == pytest.approx(summary.reasoning_share)


def _judged_fed() -> LiveMetrics:
    """--slo ttft=500ms,e2e=1s on target "a", level 1 of a run with levels 1 and 2: a good streamed
    request (10 tokens), one late on both targets (20 tokens), a request that did not stream (its
    TTFT unknown: unjudged), a timeout (error) and one the client cancelled (not judged)."""
    from loadgen.analysis.slo import parse_slo

    live = LiveMetrics(levels=(1, 2), slo=parse_slo("ttft=500ms,e2e=1s"))
    live.level_started(LevelRun(target="a", concurrency=1), 5, None)
    for r in _judged_records():
        live.request_done(r)
    return live


def _judged_records() -> list:
    return [
        make_record("a", 1, 0, 0, "s", 0, 800 * MS, 200, ServerOutcome(predicted_n=10), None, None, 300 * MS,
                    700 * MS, [1000], 2),
        make_record("a", 1, 0, 1, "s", 0, 1500 * MS, 200, ServerOutcome(predicted_n=20), None, None, 600 * MS,
                    1400 * MS, [1000], 2),
        make_record("a", 1, 0, 2, "s", 0, 500 * MS, 200, ServerOutcome(predicted_n=5)),
        make_record("a", 1, 0, 3, "s", 0, 600 * MS, None, ServerOutcome(error_kind="timeout")),
        make_record("a", 1, 0, 4, "s", 0, 100 * MS, None, ServerOutcome(error_kind="cancelled")),
    ]


# (series, labels, value or None for "no sample"): written down from the records above first.
JUDGED = [
    ("loadgen_requests_judged_total", dict(target="a", level="1"), 4),
    ("loadgen_requests_good_total", dict(target="a", level="1"), 1),
    ("loadgen_good_output_tokens_total", dict(target="a", level="1"), 10),
    ("loadgen_slo_misses_total", dict(target="a", level="1", missed="ttft"), 1),
    ("loadgen_slo_misses_total", dict(target="a", level="1", missed="e2e"), 1),
    ("loadgen_slo_misses_total", dict(target="a", level="1", missed="error"), 1),
    ("loadgen_slo_misses_total", dict(target="a", level="1", missed="unjudged"), 1),
    ("loadgen_slo_attainment_ratio", dict(target="a", level="1"), 0.25),
    ("loadgen_slo_attainment_required_ratio", {}, 0.9),
    ("loadgen_requests_good_total", dict(target="a", level="2"), 0),  # made at 0
    ("loadgen_slo_misses_total", dict(target="a", level="2", missed="ttft"), 0),
    ("loadgen_slo_attainment_ratio", dict(target="a", level="2"), None),  # nothing judged: no sample, not 0
]


@pytest.mark.parametrize("name, labels, value", JUDGED)
def test_good_requests_and_attainment_are_served_live_with_an_slo(name, labels, value):
    samples = _samples(_judged_fed())
    if value is None:
        assert _key(name, **labels) not in samples
    else:
        assert samples[_key(name, **labels)] == pytest.approx(value)


def test_the_live_judgement_is_the_levels_and_absent_without_an_slo():
    from loadgen.analysis.slo import SloTally, parse_slo

    samples = _samples(_judged_fed())
    level = SloTally.of(parse_slo("ttft=500ms,e2e=1s"), _judged_records()).result(1.0)
    assert samples[_key("loadgen_slo_attainment_ratio", target="a", level="1")] == pytest.approx(level.attainment)
    assert samples[_key("loadgen_requests_good_total", target="a", level="1")] == level.good
    assert {m: samples[_key("loadgen_slo_misses_total", target="a", level="1", missed=m)]
            for m in level.misses} == level.misses
    assert not any(name.startswith(("loadgen_slo_", "loadgen_requests_good", "loadgen_requests_judged"))
                   for name, _ in _samples(_fed()))
