"""Drawn workloads (issue 35): length specs, seeded draws that follow the asked distribution, one
body per shape, records that keep what each request asked for, realised distributions per level,
and compare refusing runs of different workloads."""

from __future__ import annotations

import json

import msgspec
import numpy as np
import pytest

from loadgen.analysis.aggregate import LevelAggregate
from loadgen.analysis.compare import CompareError, check_comparable
from loadgen.client.backends import GenerationParams, make_backend
from loadgen.core.errors import ConfigError
from loadgen.core.records import RequestRecord
from loadgen.core.workload import LengthSpec, RequestShape, Workload, lognormal_params, parse_length_spec
from loadgen.results.reader import load_records, load_run_dict
from servers import SimThread

stats = pytest.importorskip("scipy.stats")

# (spec as typed, kind, canonical text, largest): written before the parser was run.
SPECS = [
    ("256", "fixed", "256", 256),
    (" uniform:64:256 ", "uniform", "uniform:64:256", 256),
    ("uniform:5,5", "uniform", "uniform:5:5", 5),
    ("normal:200,50,min=32,max=512", "normal", "normal:200,50,min=32,max=512", 512),
    ("normal:200,50", "normal", "normal:200,50,min=1", None),
    ("NORMAL:200.5,0", "normal", "normal:200.5,0,min=1", None),
    ("lognormal:300,200,max=4096", "lognormal", "lognormal:300,200,min=1,max=4096", 4096),
]

# (spec, a phrase of the one-line error): each is refused.
BAD_SPECS = [
    ("0", "at least 1"),
    ("uniform:300:200", "below the lowest"),
    ("uniform:64", "uniform:LOW:HIGH"),
    ("uniform:1.5:8", "whole number"),
    ("normal:200", "normal:MEAN,SD"),
    ("normal:-5,2", "mean must be positive"),
    ("normal:200,50,min=600,max=512", "max is below min"),
    ("normal:200,50,cap=9", "unknown key"),
    ("zipf:1,2", "give a token count"),
    ("normal:nan,1", "not a finite number"),
    ("file:/nonexistent/lengths.txt", "cannot read"),
]


@pytest.mark.parametrize("text, kind, canon, largest", SPECS)
def test_a_spec_parses_to_its_kind_and_canonical_text(text, kind, canon, largest):
    spec = parse_length_spec(text)
    assert (spec.kind, spec.text, spec.largest()) == (kind, canon, largest)


@pytest.mark.parametrize("text, phrase", BAD_SPECS)
def test_a_bad_spec_is_one_line_naming_the_flag(text, phrase):
    with pytest.raises(ConfigError) as info:
        parse_length_spec(text, "--n-predict")
    message = str(info.value)
    assert phrase in message and message.startswith("--n-predict") and "\n" not in message


def test_a_lengths_file_is_an_empirical_distribution(tmp_path):
    path = tmp_path / "lengths.txt"
    path.write_text("10\n20, 20\n\n400\n")
    spec = parse_length_spec(f"file:{path}")
    assert spec.values == (10, 20, 20, 400) and spec.largest() == 400
    drawn = spec.draw(np.random.default_rng(1), 4000)
    assert set(drawn.tolist()) == {10, 20, 400}
    assert abs((drawn == 20).mean() - 0.5) < 0.05  # 20 is listed twice: drawn half the time
    path.write_text("10\n-3\n")
    with pytest.raises(ConfigError, match="entry 2"):
        parse_length_spec(f"file:{path}")


def test_the_same_seed_draws_the_same_shapes_and_the_specs_do_not_disturb_each_other():
    uniform, normal = parse_length_spec("uniform:64:256"), parse_length_spec("normal:50,10,min=4")
    a = Workload(uniform, normal, seed=7).draw()
    assert a == Workload(uniform, normal, seed=7).draw()
    assert a != Workload(uniform, normal, seed=8).draw()
    # Another answer spec leaves the prompt lengths as they were (separate streams).
    b = Workload(uniform, parse_length_spec("96"), seed=7).draw()
    assert [s.prompt_tokens for s in a] == [s.prompt_tokens for s in b]
    assert all(s.n_predict == 96 for s in b)
    assert len(a) == 256 and all(isinstance(s, RequestShape) for s in a)


def test_fixed_lengths_are_no_workload():
    assert not Workload(parse_length_spec("128"), parse_length_spec("96")).varies
    assert not Workload(None, parse_length_spec("96")).varies
    assert Workload(None, parse_length_spec("uniform:8:16")).varies


def _ks(spec: LengthSpec, cdf, n: int = 4000, seed: int = 3) -> float:
    return stats.kstest(spec.draw(np.random.default_rng(seed), n), cdf).pvalue


def test_drawn_lengths_pass_a_kolmogorov_smirnov_test_against_the_asked_distribution():
    # Rounding to whole tokens moves a value by at most 0.5: against a spread of 50+ it is far
    # inside what 4000 draws can tell apart, so each asked distribution passes as a continuous one.
    assert _ks(parse_length_spec("uniform:64:256"), stats.uniform(63.5, 193).cdf) > 0.01
    assert _ks(parse_length_spec("normal:200,50,min=1,max=100000"), stats.norm(200, 50).cdf) > 0.01
    mu, sigma = lognormal_params(300, 200)
    assert _ks(parse_length_spec("lognormal:300,200"), stats.lognorm(sigma, scale=np.exp(mu)).cdf) > 0.01
    # ...and the test can fail: the same draws against a neighbouring distribution are rejected.
    assert _ks(parse_length_spec("normal:200,50"), stats.norm(210, 50).cdf) < 0.001
    assert _ks(parse_length_spec("uniform:64:256"), stats.norm(160, 55).cdf) < 0.001


def test_lognormal_lengths_have_the_asked_mean_and_spread():
    drawn = parse_length_spec("lognormal:300,200").draw(np.random.default_rng(0), 200_000)
    assert abs(drawn.mean() - 300) < 3 and abs(drawn.std() - 200) < 5


def test_min_and_max_clamp_every_draw():
    drawn = parse_length_spec("normal:100,200,min=32,max=150").draw(np.random.default_rng(0), 5000)
    assert drawn.min() == 32 and drawn.max() == 150
    assert ((drawn == 32).mean() > 0.2) and ((drawn == 150).mean() > 0.3)  # the clamped tails pile up


def test_each_body_asks_for_its_own_n_predict():
    params = GenerationParams(prompt="a", prompts=("a", "b", "c"), n_predicts=(5, 6, 7))
    for api, key in (("llamacpp", "n_predict"), ("completions", "max_tokens")):
        backend = make_backend(api, params, model="m")
        bodies = [json.loads(backend.build("1234", i)) for i in range(4)]
        assert [b[key] for b in bodies] == [5, 6, 7, 5]
        assert [b["prompt"] for b in bodies] == ["[1234] a", "[1234] b", "[1234] c", "[1234] a"]
    with pytest.raises(ValueError):
        make_backend("llamacpp", GenerationParams(prompt="a", prompts=("a", "b"), n_predicts=(5,)))


def _record(seq: int, prompt_n: int | None, predicted_n: int | None, error: str | None = None) -> RequestRecord:
    return RequestRecord(target="t", level=1, worker=0, seq=seq, salt="s", send_ns=seq * 10, complete_ns=seq * 10 + 5,
                         status=200, error_kind=error, prompt_n=prompt_n, predicted_n=predicted_n,
                         prompt_ms=1.0, predicted_ms=1.0)


def test_a_level_keeps_the_realised_prompt_and_answer_lengths():
    prompts = [10, 20, 30, 40, 50, 60, 70, 80, 90, 3000]
    rs = [_record(i, p, i + 1) for i, p in enumerate(prompts)] + [_record(99, 7777, 7777, "http_500")]
    summary = LevelAggregate.of(rs).summary(1)
    # Failed requests count in neither; nearest-rank percentiles of the ten ok ones.
    assert summary.prompt_n.count == 10 and summary.prompt_n.mean == pytest.approx(345.0)
    # 3000 is above 2048, where a histogram bucket holds two counts: still shown as 3000.
    assert (summary.prompt_n.p50, summary.prompt_n.p90, summary.prompt_n.p99, summary.prompt_n.max) == \
        (50.0, 90.0, 3000.0, 3000.0)
    assert (summary.predicted_n.mean, summary.predicted_n.p50, summary.predicted_n.max) == (5.5, 5.0, 10.0)


def _doc(workload: dict | None) -> dict:
    config = {"api": "llamacpp", "mode": "concurrency", "stream": False, "prompt": "p", "n_predict": 96,
              "ignore_eos": True, **({"workload": workload} if workload else {})}
    return {"kind": "sweep", "complete": True, "config": config,
            "targets": [{"label": "a", "levels": [{"level": 1, "concurrency": 1, "requests_ok": 0, "requests_failed": 0,
                                                   "output_tokens": 0, "wall_s": 0.0, "throughput_tok_s": 0.0,
                                                   "predicted_ms_mean": None, "decode_tok_s_mean": None}]}]}


def test_compare_refuses_two_runs_of_different_workloads():
    drawn = Workload(parse_length_spec("uniform:64:256"), parse_length_spec("96")).to_dict()
    other = Workload(parse_length_spec("uniform:64:256"), parse_length_spec("96"), seed=1).to_dict()
    assert check_comparable(_doc(drawn), _doc(dict(drawn))) == []
    assert check_comparable(_doc(None), _doc(None)) == []
    for base, cand in ((drawn, None), (None, drawn), (drawn, other)):
        with pytest.raises(CompareError) as info:
            check_comparable(_doc(base), _doc(cand))
        assert "workload" in str(info.value) and "\n" not in str(info.value)


def test_a_drawn_sweep_asks_each_request_for_its_shape_and_gets_it(loadgen, tmp_path):
    out = tmp_path / "run"
    with SimThread() as sim:
        code, stdout, err = loadgen("sweep", "--url", sim.url, "--concurrency", "2", "--requests", "24",
                                    "--prompt-tokens", "uniform:40:300", "--n-predict", "normal:12,4,min=2,max=30",
                                    "--workload-seed", "5", "--warmup", "1", "--output", out)
    assert code == 0, err
    shapes = Workload(parse_length_spec("uniform:40:300"), parse_length_spec("normal:12,4,min=2,max=30"),
                      seed=5).draw()
    records = load_records(out)
    assert len(records) == 24
    for r in records:
        shape = shapes[r.seq % len(shapes)]
        assert (r.prompt_tokens_target, r.n_predict_target) == (shape.prompt_tokens, shape.n_predict)
        # The simulator tokenizes as its /tokenize does: the drawn length is the prompt, salt included.
        assert (r.prompt_n, r.predicted_n) == (shape.prompt_tokens, shape.n_predict)
    doc = load_run_dict(out)
    assert doc["config"]["workload"] == {"prompt_tokens": "uniform:40:300", "n_predict": "normal:12,4,min=2,max=30",
                                         "seed": 5, "shapes": 256}
    level = doc["targets"][0]["levels"][0]
    assert level["prompt_n"]["max"] == max(r.prompt_n for r in records)
    assert level["predicted_n"]["mean"] == pytest.approx(np.mean([r.predicted_n for r in records]), abs=5e-4)
    assert "workload: tokens per request (asked: prompt uniform:40:300" in stdout


@pytest.mark.parametrize("args, phrase", [
    (("--prompt-tokens", "uniform:1:2"), "raise the distribution's min="),
    (("--prompt-tokens", "uniform:64:3000"), "largest request"),
    (("--prompt-tokens", "uniform:64:128", "--workers", "2", "--concurrency", "2"), "drop --workers"),
    (("--n-predict", "gauss:4,4"), "give a token count"),
])
def test_a_workload_that_cannot_run_is_refused_in_one_line(loadgen, tmp_path, args, phrase):
    with SimThread() as sim:
        code, out, err = loadgen("sweep", "--url", sim.url, "--concurrency", "1", "--requests", "2", *args,
                                 "--warmup", "0", "--output", tmp_path / "run")
    assert code != 0
    lines = [ln for ln in (out + err).splitlines() if phrase in ln]
    assert lines, (out, err)


def test_a_scenario_takes_distributions_as_strings_and_numbers(loadgen, tmp_path):
    scenario = tmp_path / "s.toml"
    scenario.write_text('mode = "sweep"\nports = [9]\nprompt_tokens = "normal:200,50,max=400"\nn_predict = 32\n')
    code, out, err = loadgen("run", str(scenario), "--check")
    assert code == 0, err
    scenario.write_text('mode = "sweep"\nports = [9]\nprompt_tokens = "normal:200"\n')
    code, out, err = loadgen("run", str(scenario), "--check")
    assert code == 2 and "normal:MEAN,SD" in err


def test_records_keep_their_asked_answer_length_through_a_round_trip():
    r = msgspec.structs.replace(_record(1, 64, 9), n_predict_target=9, prompt_tokens_target=64)
    assert RequestRecord.from_dict(json.loads(json.dumps(r.to_dict()))) == r
