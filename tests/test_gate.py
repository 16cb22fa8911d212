"""`compare` and `gate` over synthetic runs: pure functions first, then the CLI. No network.

Synthetic levels are closed loops like the engine's: each of C workers sends its next request when
the previous one completes; service times are log-normal. A "slower" candidate multiplies them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from loadgen.analysis import compare, gate, metrics
from loadgen.cli.gate import gate_command, load_gate_file
from loadgen.client.backends import GenerationParams
from loadgen.core.records import CANCELLED, LevelRun, RequestRecord
from loadgen.output import comparison
from loadgen.results import schema, writer
from loadgen.run.config import SweepConfig, Target
from loadgen.run.model import Run, TargetRun

MS = 1_000_000
LABEL = "smollm2"
PROMPT = "Describe mixture of experts routing in exactly three sentences."


def closed_loop_level(rng: np.random.Generator, concurrency: int, requests: int, *, label: str = LABEL,
                      service_ms: float = 200.0, slowdown: float = 1.0, tail_share: float = 0.0,
                      tail_factor: float = 1.0, n_predict: int = 16, failures: int = 0) -> list[RequestRecord]:
    """One level: `requests` requests from `concurrency` workers; the last `failures` ones fail (http_500)."""
    clock = [0.0] * concurrency
    out = []
    for seq in range(requests):
        worker = min(range(concurrency), key=clock.__getitem__)
        prompt_ms = 10.0 * rng.lognormal(0, 0.15)
        predicted_ms = service_ms * slowdown * rng.lognormal(0, 0.15)
        if rng.random() < tail_share:
            predicted_ms *= tail_factor
        overhead_ms = 2.0 * rng.lognormal(0, 0.3)
        send = clock[worker]
        done = send + prompt_ms + predicted_ms + overhead_ms
        clock[worker] = done + 0.1
        failed = seq >= requests - failures
        out.append(RequestRecord(
            target=label, level=concurrency, worker=worker, seq=seq, salt=f"s{seq}", send_ns=int(send * MS),
            complete_ns=int(done * MS), status=500 if failed else 200, error_kind="http_500" if failed else None,
            **({} if failed else dict(prompt_n=20, prompt_ms=prompt_ms, predicted_n=n_predict,
                                      predicted_ms=predicted_ms, tokens_predicted=n_predict,
                                      predicted_per_second=n_predict / predicted_ms * 1000, stop_type="limit",
                                      cache_n=0))))
    return out


def sweep_run(levels: dict[int, list[RequestRecord]], *, label: str = LABEL, n_predict: int = 16,
              prompt: str = PROMPT) -> Run:
    target = Target(url="http://127.0.0.1:8080", label=label)
    config = SweepConfig(targets=(target,), concurrency=tuple(levels),
                         generation=GenerationParams(prompt=prompt, n_predict=n_predict))
    levels_run = [LevelRun(target=label, concurrency=c, records=rs) for c, rs in levels.items()]
    return Run(config=config, targets=[TargetRun(target=target, label=label, levels=levels_run)])


def as_run(levels: dict[int, list[RequestRecord]], *, summaries: bool = True, **kw) -> tuple[dict, list[RequestRecord]]:
    """(run.json document, records) as `loadgen sweep` would write them, without the files.

    The gate reads only the config and the level list of run.json (it recomputes every figure from
    the records), so the many-trial tests skip the level summaries, which are slow to compute.
    """
    run = sweep_run(levels, **kw)
    if summaries:
        doc = json.loads(json.dumps(writer.run_document(run, meta={"kind": "sweep"})))
    else:
        doc = {"schema": schema.SCHEMA, "schema_version": schema.SCHEMA_VERSION, "kind": "sweep", "complete": True,
               "config": run.config.to_dict(),
               "targets": [{"label": t.label, "levels": [{"level": lv.concurrency, "concurrency": lv.concurrency} for lv in t.levels]}
                           for t in run.targets]}
    return doc, [r for rs in levels.values() for r in rs]


def write_run(path: Path, levels: dict[int, list[RequestRecord]], **kw) -> Path:
    path.mkdir(parents=True)
    writer.write_results(path, sweep_run(levels, **kw), meta={"kind": "sweep"})
    return path


def pair(seed: int, shape: dict[int, int], **candidate) -> tuple[tuple, tuple]:
    """A baseline and a candidate run, one closed-loop level per {concurrency: requests}."""
    rng = np.random.default_rng(seed)
    base = as_run({c: closed_loop_level(rng, c, n) for c, n in shape.items()}, summaries=False)
    cand = as_run({c: closed_loop_level(rng, c, n, **candidate) for c, n in shape.items()}, summaries=False)
    return base, cand


def failed_metrics(result: gate.GateResult) -> set[str]:
    return {c.metric for c in result.with_status(gate.FAIL)}


# ---------------------------------------------------------------- statistics


def test_percentiles_agree_with_run_json():
    rng = np.random.default_rng(7)
    for n in (1, 4, 12, 60, 250):
        values = list(rng.lognormal(5, 0.4, n))
        dist = metrics.distribution_ms(values)
        assert compare.quantile(values, 0.5) == pytest.approx(dist.p50, rel=1e-3)
        assert compare.quantile(values, 0.99) == pytest.approx(dist.p99, rel=1e-3)


def test_throughput_windows_average_to_the_level_throughput():
    records = closed_loop_level(np.random.default_rng(1), 4, 40)
    windows = compare.throughput_windows(records)
    assert len(windows) == 5
    assert np.mean(windows) == pytest.approx(metrics.throughput_tok_s(records))


def test_throughput_needs_a_completion_in_every_window():
    records = closed_loop_level(np.random.default_rng(1), 1, 3)
    assert compare.throughput_windows(records) is None
    (base, base_records), (cand, cand_records) = pair(1, {1: 3})
    result = compare.compare_runs(base, base_records, cand, cand_records)
    throughput = result.levels[0].get("throughput")
    assert throughput.significant is None and "too few completions" in throughput.note


def test_the_same_two_runs_always_give_the_same_answer():
    base, cand = pair(3, {1: 20, 4: 40})
    first = compare.compare_runs(*base, *cand).to_dict()
    assert compare.compare_runs(*base, *cand).to_dict() == first


def test_same_distribution_passes_at_least_95_of_100_trials():
    passed = 0
    for seed in range(100):
        base, cand = pair(1000 + seed, {1: 40, 4: 120})
        passed += gate.run_gate(*base, *cand, gate.GateConfig()).exit_code == 0
    print(f"same distribution: {passed}/100 passed")
    assert passed >= 95, f"only {passed}/100 same-distribution trials passed"


def test_a_20_percent_throughput_drop_fails_every_time():
    for seed in range(20):
        base, cand = pair(2000 + seed, {1: 40, 4: 120}, slowdown=1.25)  # 1/1.25 = 80% of the throughput
        result = gate.run_gate(*base, *cand, gate.GateConfig())
        assert result.exit_code == 1
        failing = [comparison.check_line(c, result.check_confidence) for c in result.with_status(gate.FAIL)]
        assert any(line.startswith(f"REGRESSION: throughput {LABEL} at concurrency 4") for line in failing)


def test_a_30_percent_p99_rise_in_the_tail_fails_every_time():
    rises = []
    for seed in range(20):
        # one request in 20 takes 1.7x as long: the median barely moves, the tail does
        base, cand = pair(3000 + seed, {4: 800}, tail_share=0.05, tail_factor=1.7)
        result = gate.run_gate(*base, *cand, gate.GateConfig())
        p99 = next(c for c in result.checks if c.metric == "latency_p99")
        rises.append(p99.comparison.change)
        assert result.exit_code == 1 and p99.status == gate.FAIL
        assert "latency_p50" not in failed_metrics(result)
    assert np.median(rises) >= 0.30


def test_significant_but_within_the_limit_passes():
    base, cand = pair(4, {4: 600}, slowdown=1.03)
    result = gate.run_gate(*base, *cand, gate.GateConfig(metrics=("latency_p50",)))
    (check,) = result.checks
    assert check.comparison.significant and 0.01 < check.comparison.change < 0.05
    assert check.status == gate.PASS and result.exit_code == 0


def latency_records(latencies_ms: list[float]) -> list[RequestRecord]:
    return [RequestRecord(target=LABEL, level=1, worker=0, seq=i, salt=f"s{i}", send_ns=i * 10_000 * MS,
                          complete_ns=int((i * 10_000 + v) * MS), status=200, predicted_n=16, prompt_ms=1.0,
                          predicted_ms=v - 2, predicted_per_second=16_000 / v)
            for i, v in enumerate(latencies_ms)]


def test_beyond_the_limit_but_not_significant_passes_with_a_note():
    base = latency_records([100, 200, 300, 400, 500, 600, 700, 800])
    cand = latency_records([110, 210, 330, 440, 500, 600, 700, 800])  # median +10%, but the samples overlap
    result = gate.run_gate(*as_run({1: base}), *as_run({1: cand}), gate.GateConfig(metrics=("latency_p50",)))
    (check,) = result.checks
    assert check.comparison.change == pytest.approx(0.10) and check.comparison.significant is False
    assert check.status == gate.NOT_SIGNIFICANT and result.exit_code == 0
    assert "within noise, not counted" in comparison.check_line(check, result.check_confidence)


def test_too_little_data_is_inconclusive_and_fails_only_with_strict():
    base, cand = pair(5, {2: 12}, tail_share=0.3, tail_factor=2.0)
    config = gate.GateConfig(metrics=("latency_p99",))
    result = gate.run_gate(*base, *cand, config)
    (check,) = result.checks
    assert check.comparison.change > 0.10 and check.status == gate.INCONCLUSIVE
    assert result.exit_code == 0
    assert gate.run_gate(*base, *cand, gate.GateConfig(metrics=("latency_p99",), strict=True)).exit_code == 1


def test_error_rate_is_an_absolute_ceiling_and_ignores_cancelled_requests():
    rng = np.random.default_rng(6)
    base = as_run({2: closed_loop_level(rng, 2, 20)})
    cand_records = closed_loop_level(rng, 2, 20, failures=1)
    cancelled = RequestRecord(target=LABEL, level=2, worker=0, seq=99, salt="c", send_ns=0, complete_ns=MS,
                              error_kind=CANCELLED)
    cand = as_run({2: cand_records + [cancelled]})
    strict_zero = gate.run_gate(*base, *cand, gate.GateConfig(metrics=("error_rate",)))
    (check,) = strict_zero.checks
    assert check.comparison.candidate == pytest.approx(1 / 20)  # the cancelled one is not counted
    assert check.status == gate.FAIL and strict_zero.exit_code == 1
    assert "1 of 20 requests failed" in comparison.check_line(check, strict_zero.check_confidence)
    tolerant = gate.run_gate(*base, *cand, gate.GateConfig(metrics=("error_rate",), max_error_rate=0.10))
    assert tolerant.exit_code == 0


def test_each_check_is_tested_at_a_bonferroni_corrected_confidence():
    base, cand = pair(8, {1: 20, 2: 20})
    result = gate.run_gate(*base, *cand, gate.GateConfig())
    # 2 levels x 3 statistical metrics (the error rate is not a test)
    assert result.check_confidence == pytest.approx(1 - 0.05 / 6)
    assert result.comparison.confidence == result.check_confidence


def test_levels_in_only_one_run_are_skipped():
    rng = np.random.default_rng(9)
    base = as_run({c: closed_loop_level(rng, c, 12) for c in (1, 2, 4)})
    cand = as_run({c: closed_loop_level(rng, c, 12) for c in (1, 2, 8)})
    result = compare.compare_runs(*base, *cand)
    assert [(lv.target, lv.concurrency) for lv in result.levels] == [(LABEL, 1), (LABEL, 2)]
    assert result.skipped == (f"{LABEL} at concurrency 4: only in the baseline",
                              f"{LABEL} at concurrency 8: only in the candidate")


@pytest.mark.parametrize("candidate_kw, message", [
    (dict(n_predict=32), "n_predict is 16 in the baseline, 32 in the candidate"),
    (dict(prompt="Something else"), "prompt differs"),
    (dict(label="other"), "share no target label"),
])
def test_runs_that_cannot_be_compared_are_refused(candidate_kw, message):
    rng = np.random.default_rng(10)
    base = as_run({1: closed_loop_level(rng, 1, 12)})
    label = candidate_kw.get("label", LABEL)
    cand = as_run({1: closed_loop_level(rng, 1, 12, label=label)}, **candidate_kw)
    with pytest.raises(compare.CompareError, match=message):
        compare.compare_runs(*base, *cand)


def test_disjoint_levels_are_refused():
    rng = np.random.default_rng(11)
    base = as_run({1: closed_loop_level(rng, 1, 12)})
    cand = as_run({2: closed_loop_level(rng, 2, 12)})
    with pytest.raises(compare.CompareError, match="share no level"):
        gate.run_gate(*base, *cand, gate.GateConfig())


# ---------------------------------------------------------------- limits and the gate file


def test_limits_parse_bare_and_keyed_forms():
    assert gate.parse_limits("10%", "x", gate.RISE_KEYS) == {
        "latency_p50": 0.10, "latency_p99": 0.10, "queue_wait_p50": 0.10}
    assert gate.parse_limits("p99:10%,p50:5%", "x", gate.RISE_KEYS) == {"latency_p99": 0.10, "latency_p50": 0.05}
    assert gate.parse_limits({"decode": 0.2}, "x", gate.DROP_KEYS) == {"decode_tok_s": 0.2}
    assert gate.parse_share("0", "x") == 0.0 and gate.parse_share(0.05, "x") == 0.05
    assert gate.parse_metrics(["p99,throughput", "queue_wait"], "x") == ("latency_p99", "throughput", "queue_wait_p50")


@pytest.mark.parametrize("value, message", [
    ("p95:10%", "unknown key 'p95'"),
    ("10", "ambiguous; write 10% or 0.1"),
    ("-5%", "must be a share >= 0"),
    ("fast", "expected a share"),
    ("p99:", "expected a share"),
])
def test_bad_limits_are_explained(value, message):
    with pytest.raises(gate.GateConfigError, match=message):
        gate.parse_limits(value, "--max-latency-rise", gate.RISE_KEYS)


def test_gate_file_sets_limits_and_flags_override_it(tmp_path):
    path = tmp_path / "gate.toml"
    path.write_text('[gate]\nmax_throughput_drop = "10%"\nmax_latency_rise = { p99 = "20%", p50 = 0.08 }\n'
                    'max_error_rate = "2%"\nconfidence = 0.99\nmetrics = ["throughput", "p99"]\nstrict = true\n')
    config = gate.build_config(load_gate_file(path),
                               gate.parse_settings({"max_latency_rise": "p99:30%", "strict": False}, str))
    assert config.limits["throughput"] == 0.10 and config.limits["decode_tok_s"] == 0.10
    assert config.limits["latency_p99"] == 0.30 and config.limits["latency_p50"] == 0.08
    assert config.max_error_rate == 0.02 and config.confidence == 0.99
    assert config.metrics == ("throughput", "latency_p99") and config.strict is False


@pytest.mark.parametrize("text, message", [
    ('[gate]\nmax_drop = "5%"\n', "{path}: max_drop: unknown key"),
    ('[gate]\nstrict = "yes"\n', "{path}: strict: expected true or false"),
    ('[gate]\nconfidence = 95\n', "{path}: confidence: must be at least 0.5 and below 1"),
    ('[gate]\nconfidence = 0.3\n', "{path}: confidence: must be at least 0.5"),
    ('[gate]\nmetrics = ["speed"]\n', "{path}: metrics: unknown metric 'speed'"),
    ('[gate]\nmetrics = 3\n', "{path}: metrics: expected metric names"),
    ('[gates]\nstrict = true\n', "{path}: gates: unknown table"),
    ('strict = true\n', "{path}: strict: unknown table or key"),
    ('# empty\n', "{path}: gate: missing"),
    ('[gate\n', "{path}: not valid TOML"),
])
def test_a_bad_gate_file_names_the_file_and_key(tmp_path, text, message):
    path = tmp_path / "gate.toml"
    path.write_text(text)
    with pytest.raises(gate.GateConfigError) as exc:
        load_gate_file(path)
    assert str(exc.value).startswith(message.format(path=path))
    assert "\n" not in str(exc.value)


# ---------------------------------------------------------------- the commands


@pytest.fixture
def runs(tmp_path):
    """Results directories: a baseline, a same-distribution rerun, and a 1.5x slower candidate."""
    rng = np.random.default_rng(12)
    shape = {1: 24, 4: 48}
    return {
        "baseline": write_run(tmp_path / "baseline", {c: closed_loop_level(rng, c, n) for c, n in shape.items()}),
        "same": write_run(tmp_path / "same", {c: closed_loop_level(rng, c, n) for c, n in shape.items()}),
        "slower": write_run(tmp_path / "slower",
                            {c: closed_loop_level(rng, c, n, slowdown=1.5) for c, n in shape.items()}),
        "tmp": tmp_path,
    }


def test_gate_exits_1_naming_each_regression_and_writes_the_step_summary(loadgen, runs, monkeypatch):
    summary = runs["tmp"] / "summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    code, out, err = loadgen("gate", runs["baseline"], runs["slower"])
    assert code == 1, err
    lines = out.splitlines()
    assert any(line.startswith(f"REGRESSION: throughput {LABEL} at concurrency 4: ") and "CI of ratio" in line
               for line in lines)
    assert any(line.startswith(f"REGRESSION: latency_p50 {LABEL} at concurrency 1: ") and "Mann-Whitney p=" in line
               for line in lines)
    assert lines[-1].startswith("gate: FAILED")
    text = summary.read_text()
    assert text.startswith("earlier step\n") and "### loadgen gate: FAILED" in text and "**REGRESSION**" in text


def test_gate_exits_0_on_a_rerun_of_the_same_configuration(loadgen, runs):
    code, out, err = loadgen("gate", runs["baseline"], runs["same"], "--max-latency-rise", "p99:10%,p50:5%",
                             "--max-throughput-drop", "5%", "--max-error-rate", "0", "--confidence", "95%")
    assert code == 0, out + err
    assert out.splitlines()[-1].startswith("gate: passed")
    assert "REGRESSION" not in out


def test_gate_reads_limits_from_a_config_file(loadgen, runs):
    config = runs["tmp"] / "gate.toml"
    config.write_text('[gate]\nmax_throughput_drop = "60%"\nmax_latency_rise = "80%"\n')
    assert loadgen("gate", runs["baseline"], runs["slower"], "--config", config)[0] == 0
    assert loadgen("gate", runs["baseline"], runs["slower"], "--config", config, "--max-throughput-drop", "5%")[0] == 1


@pytest.mark.parametrize("output_format", ["json", "markdown", "table"])
def test_compare_prints_every_metric_of_every_level(loadgen, runs, output_format):
    code, out, err = loadgen("compare", runs["baseline"], runs["slower"], "--format", output_format)
    assert code == 0, err
    if output_format == "json":
        data = json.loads(out)
        assert [(lv["concurrency"], len(lv["metrics"])) for lv in data["levels"]] == [(1, 6), (4, 6)]
        throughput = data["levels"][1]["metrics"][0]
        assert throughput["metric"] == "throughput" and throughput["significant"] is True
        assert -0.4 < throughput["change"] < -0.2  # 1.5x the service time
    elif output_format == "markdown":
        assert out.startswith("| target | C | metric | baseline | candidate | change | significant |")
        assert f"| {LABEL} | 4 | latency_p99 |" in out
    else:
        assert "loadgen compare" in out and "decode tok/s p50" in out and "smollm2 @4" in out


def corrupt(path: Path, text: str) -> Path:
    (path / "run.json").write_text(text)
    return path


@pytest.mark.parametrize("case, message", [
    ("missing", "no such directory"),
    ("corrupt", "is not valid JSON"),
    ("version", "has schema version 99; this loadgen reads versions 1, 2"),
    ("disjoint", "share no level"),
    ("n_predict", "n_predict is 16 in the baseline, 32 in the candidate"),
    ("label", "share no target label"),
    ("bad-limit", "--max-latency-rise: unknown key 'p95'"),
    ("bad-config", "gate.toml: strict: expected true or false"),
    ("bad-flag", "No such option"),
])
@pytest.mark.parametrize("command", ["gate", "compare"])
def test_bad_input_is_one_line_and_exit_2(loadgen, runs, command, case, message):
    rng = np.random.default_rng(13)
    tmp = runs["tmp"]
    candidate, extra = runs["same"], []
    if case == "missing":
        candidate = tmp / "nope"
    elif case == "corrupt":
        candidate = corrupt(write_run(tmp / "c", {1: closed_loop_level(rng, 1, 8)}), "{not json")
    elif case == "version":
        candidate = write_run(tmp / "c", {1: closed_loop_level(rng, 1, 8)})
        doc = json.loads((candidate / "run.json").read_text())
        corrupt(candidate, json.dumps({**doc, "schema_version": 99}))
    elif case == "disjoint":
        candidate = write_run(tmp / "c", {2: closed_loop_level(rng, 2, 8), 8: closed_loop_level(rng, 8, 16)})
    elif case == "n_predict":
        candidate = write_run(tmp / "c", {1: closed_loop_level(rng, 1, 8)}, n_predict=32)
    elif case == "label":
        candidate = write_run(tmp / "c", {1: closed_loop_level(rng, 1, 8, label="other")}, label="other")
    elif case == "bad-limit":
        extra = ["--max-latency-rise", "p95:10%"] if command == "gate" else ["--confidence", "p95:10%"]
        message = message if command == "gate" else "--confidence: must be at least 0.5 and below 1"
    elif case == "bad-config":
        (tmp / "gate.toml").write_text("[gate]\nstrict = 1\n")
        extra = ["--config", tmp / "gate.toml"] if command == "gate" else ["--format", "yaml"]
        message = message if command == "gate" else "Invalid value for '--format'"
    elif case == "bad-flag":
        extra = ["--bogus"]
    code, out, err = loadgen(command, runs["baseline"], candidate, *extra)
    assert code == 2, out + err
    assert err.count("\n") == 1 and err.startswith("loadgen: error: ") and message in err, err
    assert "Traceback" not in err and out == ""


def test_standalone_commands_also_exit_2_with_one_line():
    result = CliRunner().invoke(gate_command, ["/nonexistent/a", "/nonexistent/b"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "Error: baseline /nonexistent/a: no such directory; give a results directory written by `loadgen sweep`"]


def test_a_demo_run_is_not_compared_with_a_real_sweep():
    rng = np.random.default_rng(14)
    base = as_run({1: closed_loop_level(rng, 1, 12)})
    doc, records = as_run({1: closed_loop_level(rng, 1, 12)})
    with pytest.raises(compare.CompareError, match="the candidate a demo run"):
        compare.compare_runs(*base, {**doc, "kind": "demo"}, records)
