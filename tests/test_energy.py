"""Energy per token from counter samples (analysis/energy.py): a table of samples whose answers were
worked out by hand first."""

from __future__ import annotations

import pytest

from loadgen.analysis.energy import idle_power, level_energy
from loadgen.core.environment import EnvSample, GpuFacts, RaplZone

WRAP_UJ = 262_143_328_850  # a RAPL package's max_energy_range_uj


def sample(at_s: float, package_uj: int | None = None, gpu_mj: int | None = None, psys_uj: int | None = None) -> EnvSample:
    rapl = []
    if package_uj is not None:
        rapl.append(RaplZone(zone="intel-rapl:0", name="package-0", energy_uj=package_uj, max_energy_range_uj=WRAP_UJ))
    if psys_uj is not None:  # overlaps the package: never added
        rapl.append(RaplZone(zone="intel-rapl:1", name="psys", energy_uj=psys_uj, max_energy_range_uj=WRAP_UJ))
    gpus = (GpuFacts(index=0, name="G", energy_mj=gpu_mj),) if gpu_mj is not None else ()
    return EnvSample(at_s=at_s, rapl=tuple(rapl), gpus=gpus)


# (samples, output tokens, idle W, expected {source: (energy J, mean W, net J/token, J/token, tokens/J)})
CASES = [
    # 100 W for 10 s = 1000 J over 500 tokens: 2 J/token; idle 40 W -> net 600 J, 1.2 J/token
    ("cpu", [sample(0, 0), sample(10, 1_000_000_000)], 500, {"cpu": 40.0},
     {"cpu": (1000.0, 100.0, 1.2, 2.0, 0.5)}),
    # the counter wrapped: (WRAP - 500 J) -> 500 J is 1000 J
    ("wrap", [sample(0, WRAP_UJ - 500_000_000), sample(10, 500_000_000)], 500, {"cpu": 40.0},
     {"cpu": (1000.0, 100.0, 1.2, 2.0, 0.5)}),
    # GPU 300 W and CPU 50 W for 4 s, 1400 tokens; idle 60 + 20 W: total 1400 J, net (1400 - 320)/1400
    ("both", [sample(0, 0, 0), sample(4, 200_000_000, 1_200_000)], 1400, {"cpu": 20.0, "gpu": 60.0},
     {"cpu": (200.0, 50.0, 120 / 1400, 200 / 1400, 7.0), "gpu": (1200.0, 300.0, 960 / 1400, 1200 / 1400, 1400 / 1200),
      "total": (1400.0, 350.0, 1080 / 1400, 1.0, 1.0)}),
    # psys is not added to the package
    ("psys", [sample(0, 0, psys_uj=0), sample(2, 100_000_000, psys_uj=900_000_000)], 100, None,
     {"cpu": (100.0, 50.0, None, 1.0, 1.0)}),
]


@pytest.mark.parametrize("samples,tokens,idle,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_level_energy(samples, tokens, idle, expected):
    got = {e.source: (e.energy_j, e.mean_w, e.net_j_per_token, e.j_per_token, e.tokens_per_j)
           for e in level_energy(samples, tokens, idle)}
    assert set(got) == set(expected)
    for source, values in expected.items():
        assert got[source] == pytest.approx(values), source


def test_no_energy_without_two_samples_counters_or_tokens():
    assert level_energy([sample(0, 0)], 10) == []
    assert level_energy([sample(0), sample(1)], 10) == []  # no counters
    (cpu,) = level_energy([sample(0, 0), sample(1, 5_000_000)], 0)
    assert cpu.energy_j == 5.0 and cpu.j_per_token is None and cpu.tokens_per_j is None


def test_idle_power():
    assert idle_power([sample(0, 0, 0), sample(2, 80_000_000, 120_000)]) == {"cpu": 40.0, "gpu": 60.0}
    assert idle_power([sample(0, 0)]) == {}


def test_a_long_level_is_thinned_to_its_ends_and_evenly_between():
    from loadgen.core.environment import thinned
    samples = [sample(i, i * 1_000_000) for i in range(1000)]
    kept = thinned(samples, 100)
    assert len(kept) == 100 and kept[0] is samples[0] and kept[-1] is samples[-1]
    assert level_energy(kept, 10)[0].energy_j == level_energy(samples, 10)[0].energy_j == 999.0
    assert thinned(samples[:5], 100) == samples[:5]


def _level(lv, **fields):
    """A level as run.json holds it (the typed document's required fields), plus `fields`."""
    return {"level": lv, "concurrency": lv, "requests_ok": 4, "requests_failed": 0, "output_tokens": 40,
            "wall_s": 1.0, "throughput_tok_s": 10.0 * lv, "predicted_ms_mean": None, "decode_tok_s_mean": None,
            **fields}


def _cell_run(*j_per_token):
    levels = [_level(lv, energy=[{"source": "cpu", "j_per_token": j}]) for lv, j in zip((1, 2, 4), j_per_token)]
    return {"status": "ok", "run": {"targets": [{"label": "t", "levels": levels}]}}


def test_the_grid_names_the_cell_that_serves_a_token_for_the_least_energy():
    from loadgen.analysis.grid_cells import summarize_cell, who_wins
    a = summarize_cell("A", {}, [_cell_run(0.5, 0.3, 0.4), _cell_run(0.5, 0.32, 0.4)])
    b = summarize_cell("B", {}, [_cell_run(0.2, 0.25), _cell_run(0.22, 0.21)])
    assert a.least_j_per_token.mean == pytest.approx(0.31) and b.least_j_per_token.mean == pytest.approx(0.205)
    assert "least energy per output token, at each cell's most efficient level (J/token): B (0.205; 34% lower " \
           "than the worst)" in who_wins([a, b])
    none = summarize_cell("C", {}, [{"status": "ok", "run": {"targets": [{"label": "t", "levels": [
        _level(1, throughput_tok_s=5.0)]}]}}])
    assert none.least_j_per_token is None and not any("energy" in line for line in who_wins([a, none]))


# (net J/token as run.json keeps it, what the tables, the report and the energy lines show):
# written before running. A net at or below zero is the idle reading's noise, never a figure.
NET_SHOWN = [(0.25, "0.250"), (0.0004, "0.000"), (0.0, "≤0 (within idle noise)"),
             (-0.007, "≤0 (within idle noise)"), (None, None)]


@pytest.mark.parametrize("net,shown", NET_SHOWN)
def test_a_net_energy_at_or_below_zero_is_shown_as_idle_noise(net, shown):
    from loadgen.core.rundoc import RunDocument
    from loadgen.output.environment import energy_lines
    from loadgen.output.html import Extras, machine_cells
    from loadgen.output.report_model import RunSource, build_series, energy_points
    from loadgen.output.tables import _energy_cells
    energy = {"source": "cpu", "seconds": 2.0, "energy_j": 10.0, "j_per_token": 0.25, "net_j_per_token": net,
              "tokens_per_j": 4.0, "mean_w": 5.0}
    raw = {"targets": [{"label": "t", "levels": [_level(1, energy=[energy])]}]}
    doc = RunDocument.of(raw)
    level = doc.targets[0].levels[0]
    assert level.headline_energy.net_j_per_token == net  # the raw value stays in run.json
    table = str(_energy_cells(level)[1])
    html = machine_cells(level, Extras(energy=True, changed=False))[1]
    (line,) = energy_lines(doc)
    (series,) = build_series([RunSource("r", doc, [], [])])
    plotted = energy_points(series).net_j_per_token[0]
    if shown is None:
        assert table == "n/a" and html == "–" and "net" not in line and plotted is None
    else:
        assert table == html == shown
        assert f"net {shown}," in line if net <= 0 else f"net {net:.4g} J/token," in line
        assert plotted == (net if net > 0 else None)  # the charts draw no point for noise
        assert "-" not in table + html + line
