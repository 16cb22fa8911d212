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
from loadgen.analysis.between_runs import Floor
from loadgen.analysis.slo import parse_slo
from loadgen.cli.gate import gate_command, load_gate_file
from loadgen.client.backends import GenerationParams
from loadgen.core.errors import EXIT_NOT_ENFORCED
from loadgen.core.records import CANCELLED, LevelRun, RequestRecord
from loadgen.output import comparison
from loadgen.results import schema, writer
from loadgen.run.config import SweepConfig, Target
from loadgen.run.state import Run, TargetRun
from oracles import compare_runs

MS = 1_000_000
LABEL = "smollm2"
PROMPT = "Describe mixture of experts routing in exactly three sentences."


def closed_loop_level(rng: np.random.Generator, concurrency: int, requests: int, *, label: str = LABEL,
                      service_ms: float = 200.0, slowdown: float = 1.0, tail_share: float = 0.0,
                      tail_factor: float = 1.0, n_predict: int = 16, failures: int = 0,
                      streamed: bool = False, prefill_slowdown: float = 1.0) -> list[RequestRecord]:
    """One level: `requests` requests from `concurrency` workers; the last `failures` ones fail (http_500).
    `streamed`: with first and last token times (the first after the prefill, `prefill_slowdown` times
    as long, and the overhead; the last at the end)."""
    clock = [0.0] * concurrency
    out = []
    for seq in range(requests):
        worker = min(range(concurrency), key=clock.__getitem__)
        prompt_ms = 10.0 * prefill_slowdown * rng.lognormal(0, 0.15)
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
            **({} if failed or not streamed else dict(first_token_ns=int((send + prompt_ms + overhead_ms) * MS),
                                                         last_token_ns=int(done * MS))),
            **({} if failed else dict(prompt_n=20, prompt_ms=prompt_ms, predicted_n=n_predict,
                                      predicted_ms=predicted_ms, tokens_predicted=n_predict,
                                      predicted_per_second=n_predict / predicted_ms * 1000, stop_type="limit",
                                      cache_n=0))))
    return out


def sweep_run(levels: dict[int, list[RequestRecord]], *, label: str = LABEL, n_predict: int = 16,
              prompt: str = PROMPT, slo: str | None = None) -> Run:
    target = Target(url="http://127.0.0.1:8080", label=label)
    config = SweepConfig(targets=(target,), concurrency=tuple(levels),
                         generation=GenerationParams(prompt=prompt, n_predict=n_predict),
                         slo=parse_slo(slo) if slo else None)
    levels_run = [LevelRun(target=label, concurrency=c, records=rs) for c, rs in levels.items()]
    return Run(config=config, targets=[TargetRun(target=target, label=label, levels=levels_run)])


# The figures a level summary must have (core/rundoc.py LevelSummary), zero: the gate reads none of them.
NO_FIGURES = {"requests_ok": 0, "requests_failed": 0, "output_tokens": 0, "wall_s": 0.0, "throughput_tok_s": 0.0,
              "predicted_ms_mean": None, "decode_tok_s_mean": None}


def as_run(levels: dict[int, list[RequestRecord]], *, summaries: bool = True, **kw) -> tuple[dict, list[RequestRecord]]:
    """(run.json document, records) as `loadgen sweep` would write them, without the files.

    The gate reads only the config and the level list of run.json (it recomputes every figure from
    the records), so the many-trial tests skip the level summaries, which are slow to compute
    (`summaries=False`: each level's figures zero).
    """
    run = sweep_run(levels, **kw)
    if summaries:
        doc = json.loads(json.dumps(writer.run_document(run, meta={"kind": "sweep"})))
    else:
        doc = {"schema": schema.SCHEMA, "schema_version": schema.SCHEMA_VERSION, "kind": "sweep", "complete": True,
               "config": run.config.to_dict(),
               "targets": [{"label": t.label, "levels": [{"level": lv.concurrency, "concurrency": lv.concurrency, **NO_FIGURES}
                                                         for lv in t.levels]} for t in run.targets]}
    return doc, [r for rs in levels.values() for r in rs]


def write_run(path: Path, levels: dict[int, list[RequestRecord]], started: int = 0, **kw) -> Path:
    path.mkdir(parents=True)
    writer.write_results(path, sweep_run(levels, **kw),
                         meta={"kind": "sweep", "started_utc": f"2026-01-01T00:{started:02d}:00+00:00"})
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


def ab_sides(seed: int, shape: dict[int, int], runs: int = 3, drift_sd: float = 0.03,
             **candidate) -> tuple[list[compare.RunData], list[compare.RunData]]:
    """`runs` baseline and candidate runs recorded A B A B ... on a machine whose speed drifts (a
    random walk of `drift_sd` per run); the candidate's service times are also scaled by `candidate`."""
    rng = np.random.default_rng(seed)
    speed = np.exp(np.cumsum(rng.normal(0, drift_sd, 2 * runs)))
    base, cand = [], []
    for i in range(2 * runs):
        kw = dict(candidate) if i % 2 else {}
        kw["slowdown"] = kw.get("slowdown", 1.0) * speed[i]
        doc, records = as_run({c: closed_loop_level(rng, c, n, **kw) for c, n in shape.items()}, summaries=False)
        doc["started_utc"] = f"2026-01-01T00:{i:02d}:00+00:00"
        (cand if i % 2 else base).append(compare.RunData(doc, records))
    return base, cand


def calibration(seed: int, shape: dict[int, int], runs: int = 11, drift_sd: float = 0.03) -> compare.NoiseFloors:
    """An A/A calibration on the same machine: `runs` runs of one configuration in a row."""
    base, cand = ab_sides(seed, shape, (runs + 1) // 2, drift_sd)
    return compare.noise_floors([*base, *cand][:runs])


def one(run: tuple) -> list[compare.RunData]:
    return [compare.RunData(*run)]


def test_percentiles_agree_with_run_json():
    rng = np.random.default_rng(7)
    for n in (1, 4, 12, 60, 250):
        values = list(rng.lognormal(5, 0.4, n))
        dist = metrics.distribution_ms(values)
        assert compare.quantile(values, 0.5) == pytest.approx(dist.p50, rel=1e-3)
        assert compare.quantile(values, 0.99) == pytest.approx(dist.p99, rel=1e-3)


def test_a_runs_value_is_the_level_figure_of_its_records():
    records = closed_loop_level(np.random.default_rng(1), 4, 40)
    assert compare.level_value("throughput", records) == pytest.approx(metrics.throughput_tok_s(records))
    latencies = [metrics.latency_ms(r) for r in records]
    assert compare.level_value("latency_p99", records) == compare.quantile(latencies, 0.99)


def test_the_same_two_sides_always_give_the_same_answer():
    base, cand = ab_sides(3, {1: 20, 4: 40})
    first = compare.compare_sides(base, cand).to_dict()
    assert compare.compare_sides(list(reversed(base)), cand).to_dict() == first  # ordered by start time
    assert first["paired"] is True and first["runs"] == [3, 3]


def test_interleaved_a_a_gates_fail_in_at_most_5_of_100_trials():
    # Without a floor, 3+3 runs of a machine drifting 3% a run cannot see a 5% change: most of these
    # gates are not enforced (exit 3), which is no false alarm; a failure (exit 1) would be one.
    codes = [gate.run_gate(*ab_sides(1000 + seed, {1: 20, 4: 40}), gate.GateConfig()).exit_code
             for seed in range(100)]
    assert codes.count(1) <= 5, f"{codes.count(1)}/100 A/A gates failed"
    assert set(codes) <= {0, 1, EXIT_NOT_ENFORCED}


def test_compare_calls_no_change_significant_on_unchanged_servers():
    """Two identical servers: compare (every metric, every level) calls something significant in
    about 1 - confidence of the trials overall, not in most of them (per-request tests did)."""
    flagged = 0
    for seed in range(40):
        result = compare.compare_sides(*ab_sides(1500 + seed, {1: 20, 4: 40}))
        flagged += any(m.significant for lv in result.levels for m in lv.metrics)
    assert flagged <= 4
    single = compare_runs(*pair(1, {1: 20})[0], *pair(1, {1: 20})[1])
    assert all(m.significant is None for lv in single.levels for m in lv.metrics if m.metric != "error_rate")


def test_a_20_percent_throughput_drop_fails_every_time_with_interleaved_runs_and_a_floor():
    floors = calibration(7, {1: 40, 4: 120})
    for seed in range(20):
        base, cand = ab_sides(2000 + seed, {1: 40, 4: 120}, slowdown=1.25)  # 1/1.25 = 80% of the throughput
        result = gate.run_gate(base, cand, gate.GateConfig(), floors=floors)
        assert result.exit_code == 1
        failing = [comparison.check_line(c, result.check_confidence) for c in result.with_status(gate.FAIL)]
        assert any(line.startswith(f"REGRESSION: throughput {LABEL} at concurrency 4") for line in failing)


def test_one_run_a_side_without_a_floor_is_never_a_regression():
    base, cand = pair(4, {1: 40, 4: 120}, slowdown=1.5)
    result = gate.run_gate(one(base), one(cand), gate.GateConfig())
    assert result.exit_code == EXIT_NOT_ENFORCED and not result.with_status(gate.FAIL)
    throughput = next(c for c in result.checks if c.metric == "throughput")
    assert throughput.comparison.change < -0.25 and throughput.status == gate.INCONCLUSIVE
    assert any("one run a side and no noise floor" in line for line in comparison.detection_lines(result))
    strict = gate.run_gate(one(base), one(cand), gate.GateConfig(strict=True))
    assert strict.exit_code == 1


def test_one_run_a_side_is_judged_against_a_calibrated_floor():
    floors = compare.NoiseFloors(by_metric={m: Floor(0.02, 10) for m in compare.METRICS})
    base, slow = pair(5, {4: 120}, slowdown=1.25)
    result = gate.run_gate(one(base), one(slow), gate.GateConfig(), floors=floors)
    assert "throughput" in failed_metrics(result) and result.exit_code == 1
    _, same = pair(5, {4: 120})
    # a 2% floor and one run a side detect only changes above ~11%: no limit of 5-10% is enforced
    assert gate.run_gate(one(base), one(same), gate.GateConfig(), floors=floors).exit_code == EXIT_NOT_ENFORCED
    wide = gate.GateConfig(limits={**gate.DEFAULT_LIMITS, "throughput": 0.15})
    assert gate.run_gate(one(base), one(same), wide, floors=floors).exit_code == 0


def test_a_30_percent_p99_rise_in_the_tail_fails():
    floors = calibration(8, {4: 800}, runs=7)
    for seed in range(3):
        # one request in 20 takes 1.7x as long: the median barely moves, the tail does
        base, cand = ab_sides(3000 + seed, {4: 800}, tail_share=0.05, tail_factor=1.7)
        result = gate.run_gate(base, cand, gate.GateConfig(), floors=floors)
        p99 = next(c for c in result.checks if c.metric == "latency_p99")
        assert p99.comparison.change >= 0.20 and p99.status == gate.FAIL
        assert "latency_p50" not in failed_metrics(result)


def test_significant_but_within_the_limit_passes():
    base, cand = ab_sides(4, {4: 400}, runs=5, drift_sd=0.002, slowdown=1.03)
    result = gate.run_gate(base, cand, gate.GateConfig(metrics=("latency_p50",)))
    (check,) = result.checks
    assert check.comparison.significant and 0.01 < check.comparison.change < 0.05
    assert check.status == gate.PASS and result.exit_code == 0


def test_beyond_the_limit_but_within_the_runs_noise_is_inconclusive_and_said():
    base, cand = ab_sides(6, {4: 120}, drift_sd=0.15, slowdown=1.12)
    result = gate.run_gate(base, cand, gate.GateConfig(metrics=("throughput",)))
    (check,) = result.checks
    assert check.comparison.change < -0.05 and check.comparison.significant is False
    assert check.status == gate.INCONCLUSIVE and result.exit_code == EXIT_NOT_ENFORCED
    assert check.comparison.detectable > 0.05
    lines = comparison.detection_lines(result)
    assert any(line.startswith("warning: throughput: the limit 5% is below the smallest change these runs detect")
               for line in lines)
    assert "cannot tell this from run-to-run noise" in comparison.check_line(check, result.check_confidence)


def test_error_rate_is_an_absolute_ceiling_and_ignores_cancelled_requests():
    rng = np.random.default_rng(6)
    base = as_run({2: closed_loop_level(rng, 2, 20)})
    cand_records = closed_loop_level(rng, 2, 20, failures=1)
    cancelled = RequestRecord(target=LABEL, level=2, worker=0, seq=99, salt="c", send_ns=0, complete_ns=MS,
                              error_kind=CANCELLED)
    cand = as_run({2: cand_records + [cancelled]})
    strict_zero = gate.run_gate(one(base), one(cand), gate.GateConfig(metrics=("error_rate",)))
    (check,) = strict_zero.checks
    assert check.comparison.candidate == pytest.approx(1 / 20)  # the cancelled one is not counted
    assert check.status == gate.FAIL and strict_zero.exit_code == 1
    assert "1 of 20 requests failed" in comparison.check_line(check, strict_zero.check_confidence)
    tolerant = gate.run_gate(one(base), one(cand), gate.GateConfig(metrics=("error_rate",), max_error_rate=0.10))
    assert tolerant.exit_code == 0


def test_each_check_is_tested_at_a_bonferroni_corrected_confidence():
    base, cand = ab_sides(8, {1: 20, 2: 20})
    result = gate.run_gate(base, cand, gate.GateConfig())
    # 2 levels x 3 statistical metrics (the error rate is not a test)
    assert result.check_confidence == pytest.approx(1 - 0.05 / 6)
    assert result.comparison.check_confidence == result.check_confidence
    # compare tests every metric, the error rate too: 2 levels x 6
    assert compare.compare_sides(base, cand).check_confidence == pytest.approx(1 - 0.05 / 12)


def test_levels_in_only_one_run_are_skipped():
    rng = np.random.default_rng(9)
    base = as_run({c: closed_loop_level(rng, c, 12) for c in (1, 2, 4)})
    cand = as_run({c: closed_loop_level(rng, c, 12) for c in (1, 2, 8)})
    result = compare_runs(*base, *cand)
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
        compare_runs(*base, *cand)


def test_disjoint_levels_are_refused():
    rng = np.random.default_rng(11)
    base = as_run({1: closed_loop_level(rng, 1, 12)})
    cand = as_run({2: closed_loop_level(rng, 2, 12)})
    with pytest.raises(compare.CompareError, match="share no level"):
        gate.run_gate(one(base), one(cand), gate.GateConfig())


# ---------------------------------------------------------------- limits and the gate file


def test_limits_parse_bare_and_keyed_forms():
    assert gate.parse_limits("10%", "x", gate.RISE_KEYS) == {
        "latency_p50": 0.10, "latency_p99": 0.10, "queue_wait_p50": 0.10, "queue_wait_p99": 0.10, "ttft_p50": 0.10,
        "ttft_p99": 0.10, "tpot_p50": 0.10, "tpot_p99": 0.10}
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
    """Sides of five runs each, in folders: a baseline; a same-distribution rerun and a 1.5x slower
    candidate, each recorded interleaved with the baseline (A B A B ...)."""
    rng = np.random.default_rng(12)
    shape = {1: 40, 4: 80}

    def side(name: str, first: int, **kw) -> Path:
        for i in range(5):
            write_run(tmp_path / name / f"{i + 1:02d}", {c: closed_loop_level(rng, c, n, **kw)
                                                         for c, n in shape.items()}, started=first + 2 * i)
        return tmp_path / name

    return {"baseline": side("baseline", 0), "same": side("same", 1), "slower": side("slower", 1, slowdown=1.5),
            "tmp": tmp_path}


def test_gate_exits_1_naming_each_regression_and_writes_the_step_summary(loadgen, runs, monkeypatch):
    summary = runs["tmp"] / "summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    code, out, err = loadgen("gate", runs["baseline"], runs["slower"])
    assert code == 1, err
    lines = out.splitlines()
    assert any(line.startswith(f"REGRESSION: throughput {LABEL} at concurrency 4: ") and "CI of ratio" in line
               for line in lines)
    assert any(line.startswith(f"REGRESSION: latency_p50 {LABEL} at concurrency 1: ")
               and "t between runs (paired) p=" in line for line in lines)
    assert lines[-1].startswith("gate: FAILED")
    text = summary.read_text()
    assert text.startswith("earlier step\n") and "### loadgen gate: FAILED" in text and "**REGRESSION**" in text


# (metric, candidate's change, expected exit) written before running: a streaming server's gate on
# TTFT and TPOT (they were "unknown metric"). Prefill 3x as long: TTFT ~12 -> ~32 ms, far past its
# limit, while each token's time is unchanged; decode 1.5x: TPOT fails, TTFT does not move.
STREAMED_GATES = [
    ("ttft_p99", {"prefill_slowdown": 3.0}, 1),
    ("ttft_p50", {"prefill_slowdown": 3.0}, 1),
    ("tpot_p50", {"prefill_slowdown": 3.0}, 0),
    ("tpot_p50", {"slowdown": 1.5}, 1),
    ("tpot_p99", {"slowdown": 1.5}, 1),
    ("ttft_p50", {"slowdown": 1.5}, 0),
    ("ttft_p99", {}, 0),
]


@pytest.mark.parametrize("metric,change,code", STREAMED_GATES)
def test_a_streaming_runs_gate_checks_ttft_and_tpot(loadgen, tmp_path, metric, change, code):
    rng = np.random.default_rng(13)
    shape = {1: 40, 4: 80}
    for name, first, kw in (("baseline", 0, {}), ("candidate", 1, change)):
        for i in range(4):
            write_run(tmp_path / name / f"{i + 1:02d}", {c: closed_loop_level(rng, c, n, streamed=True, **kw)
                                                         for c, n in shape.items()}, started=first + 2 * i)
    got, out, err = loadgen("gate", tmp_path / "baseline", tmp_path / "candidate", "--metric", metric)
    assert got == code, out + err
    assert (f"REGRESSION: {metric} " in out) == (code == 1), out


# (metric, the runs' --slo, candidate's change, expected exit) written before running. Requests take
# ~212 ms (lognormal, sd 0.15): within 250 ms ~86% of them; 1.5x slower, ~5%. Within 10 s, all,
# whatever the change.
SLO_GATES = [
    ("goodput", "e2e=250ms", {"slowdown": 1.5}, 1),
    ("attainment", "e2e=250ms", {"slowdown": 1.5}, 1),
    ("goodput", "e2e=10s", {}, 0),
    ("attainment", "e2e=10s", {"prefill_slowdown": 3.0}, 0),
]


def _slo_sides(tmp_path: Path, change: dict, slo: tuple[str | None, str | None]) -> tuple[Path, Path]:
    rng = np.random.default_rng(17)
    for (name, first, kw), side_slo in zip((("baseline", 0, {}), ("candidate", 1, change)), slo):
        for i in range(4):
            write_run(tmp_path / name / f"{i + 1:02d}", {c: closed_loop_level(rng, c, n, **kw)
                                                         for c, n in {1: 40, 4: 80}.items()},
                      started=first + 2 * i, slo=side_slo)
    return tmp_path / "baseline", tmp_path / "candidate"


@pytest.mark.parametrize("metric,slo,change,code", SLO_GATES)
def test_a_gate_on_goodput_and_attainment_judges_the_runs_slo(loadgen, tmp_path, metric, slo, change, code):
    got, out, err = loadgen("gate", *_slo_sides(tmp_path, change, (slo, slo)), "--metric", metric)
    assert got == code, out + err
    assert (f"REGRESSION: {metric} " in out) == (code == 1), out


@pytest.mark.parametrize("slo,phrase", [((None, None), "a baseline run has none: run it with --slo"),
                                        (("e2e=250ms", "e2e=300ms"), "judged against different --slo")])
def test_goodput_without_one_slo_shared_by_the_runs_is_refused_in_one_line(loadgen, tmp_path, slo, phrase):
    code, out, err = loadgen("gate", *_slo_sides(tmp_path, {}, slo), "--metric", "goodput")
    assert code == 2 and phrase in err and len(err.strip().splitlines()) == 1, out + err


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
        assert data["runs"] == [5, 5] and data["paired"] is True
        assert [(lv["concurrency"], len(lv["metrics"])) for lv in data["levels"]] == [(1, 6), (4, 6)]
        throughput = data["levels"][1]["metrics"][0]
        assert throughput["metric"] == "throughput" and throughput["significant"] is True
        assert -0.4 < throughput["change"] < -0.2  # 1.5x the service time
    elif output_format == "markdown":
        assert out.startswith("| target | C | metric | baseline | candidate | change | significant |")
        assert f"| {LABEL} | 4 | latency_p99 |" in out
    else:
        assert "loadgen compare (5+5 interleaved runs" in out and "decode tok/s p50" in out and "smollm2 @4" in out


def test_gate_reads_the_noise_floor_beside_the_baseline_and_calibrate_writes_it(loadgen, runs):
    code, out, err = loadgen("calibrate", runs["baseline"])
    assert code == 0, err
    assert (runs["baseline"] / "noise.json").is_file() and "throughput: run-to-run noise" in out
    code, out, err = loadgen("gate", runs["baseline"], runs["same"])
    assert code == 0, err
    assert "noise floor from" in out.splitlines()[-1]
    assert loadgen("gate", runs["baseline"], runs["slower"])[0] == 1
    (runs["tmp"] / "bad.json").write_text("{}")
    code, _, err = loadgen("gate", runs["baseline"], runs["same"], "--noise", runs["tmp"] / "bad.json")
    assert code == 2 and "not a loadgen noise file" in err and err.count("\n") == 1
    code, _, err = loadgen("calibrate", runs["baseline"] / "01")
    assert code == 2 and "a noise floor needs at least 3 runs" in err


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
        compare_runs(*base, {**doc, "kind": "demo"}, records)
