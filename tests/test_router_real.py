"""--models against the test bed's llama-server router (docs/router.md): three SmolLM2 files under
other names behind one port. On --models-max 2, requests cycling over the three wait for a load
each time (thrash, with each model's cold load split from its prefill); on --models-max 3 each
model loads once (no thrash). Σ output tokens per model equal the router's per-model /metrics."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from statistics import median

import pytest

import servers
from loadgen.output.router import read_timelines, router_view
from loadgen.results.reader import load_records
from servers import LOADGEN, LlamaServer, start_llama_server, sweep

pytestmark = pytest.mark.real

NAMES = ("smol-a", "smol-b", "smol-c")


def _router(tmp_path_factory: pytest.TempPathFactory, models_max: int) -> Iterator[LlamaServer]:
    folder = tmp_path_factory.mktemp(f"models{models_max}")
    _, model = servers.testbed_paths()
    for name in NAMES:  # the router takes symlinks: no copies of the file
        (folder / f"{name}.gguf").symlink_to(model)
    server = start_llama_server(None, 1, folder, models_dir=folder,
                                extra=("--models-max", str(models_max), "--no-warmup", "-c", "512"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def router2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    yield from _router(tmp_path_factory, 2)


@pytest.fixture(scope="module")
def router3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    yield from _router(tmp_path_factory, 3)


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read()


def _tokens_predicted(url: str, model: str) -> float:
    text = _get(f"{url}/metrics?model={model}").decode()
    return next(float(line.split()[1]) for line in text.splitlines()
                if line.startswith("llamacpp:tokens_predicted_total "))


def _run(server: LlamaServer, out: Path, requests: int):
    proc = sweep("--url", server.url, "--models", "all", "--concurrency", "1", "--requests", str(requests),
                 "--warmup", "0", "--n-predict", "8", "--stream", "--output", str(out), timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = load_records(out)
    (timeline,) = read_timelines(out)
    figures, verdict = router_view(records, timeline)
    return proc, records, timeline, figures, verdict


def test_three_models_on_two_thrash_with_cold_loads_split(router2: LlamaServer, tmp_path: Path) -> None:
    proc, records, timeline, figures, verdict = _run(router2, tmp_path / "run", 9)
    assert sorted(f.model for f in figures) == sorted(NAMES) and timeline.models_max == 2
    assert verdict is not None and verdict.thrash, verdict
    assert "3 models on --models-max 2" in verdict.line and "affinity" in verdict.line
    assert verdict.line in proc.stdout
    assert json.loads((tmp_path / "run" / "run.json").read_text())["targets"][0]["router"]["verdict"] == verdict.line
    again = subprocess.run([*LOADGEN, "analyze", str(tmp_path / "run")], capture_output=True, text=True, timeout=60)
    assert "models behind the router" in again.stdout and verdict.line in again.stdout
    for f in figures:
        assert f.requests == 3 and f.ok == 3 and f.waited >= 2 and f.loads >= 2, f
        # a load of a 135M model: a few hundred ms on an idle machine, seconds on a busy one
        assert 20 < median(f.cold_load_ms) < 15_000, f
        assert f.load_ms and 20 < median(f.load_ms) < 15_000, f
    # a model loaded at the end counts the requests its last load served (answered after it began
    # loading), as its /metrics?model= says
    statuses = {m["id"]: m["status"]["value"] for m in json.loads(_get(router2.url + "/models"))["data"]}
    for name, status in statuses.items():
        if status != "loaded":
            continue  # asking its /metrics would load it again
        began = max(e.t_ns for e in timeline.events if e.model == name and e.status == "loading")
        since = sum(r.output_tokens or 0 for r in records if r.model == name and r.complete_ns > began)
        assert since == _tokens_predicted(router2.url, name), name


def test_three_models_on_three_load_once_and_do_not_thrash(router3: LlamaServer, tmp_path: Path) -> None:
    _, records, timeline, figures, verdict = _run(router3, tmp_path / "run", 9)
    assert verdict is not None and not verdict.thrash, verdict
    for f in figures:
        assert (f.requests, f.ok, f.waited, f.loads, f.unloads) == (3, 3, 1, 1, 0), f
        assert f.output_tokens == _tokens_predicted(router3.url, f.model)
        assert f.output_tokens == sum(r.output_tokens or 0 for r in records if r.model == f.model)


def test_a_model_the_router_lacks_is_refused_before_the_first_level(router3: LlamaServer, tmp_path: Path) -> None:
    proc = sweep("--url", router3.url, "--models", "smol-a,nosuch", "--concurrency", "1", "--requests", "1",
                 "--output", str(tmp_path / "run"), timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "nosuch" in proc.stderr and "smol-a, smol-b, smol-c" in proc.stderr


def test_a_router_without_models_is_refused_and_model_names_one(router3: LlamaServer, tmp_path: Path) -> None:
    proc = sweep("--url", router3.url, "--concurrency", "1", "--requests", "2", "--output", str(tmp_path / "no"),
                 timeout=60)
    assert proc.returncode == 1 and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "router" in proc.stderr and "--models NAME:W,...|all" in proc.stderr and "--model NAME" in proc.stderr
    proc = sweep("--url", router3.url, "--api", "chat", "--model", "smol-b", "--concurrency", "1", "--requests", "2", "--warmup", "0",
                 "--n-predict", "4", "--output", str(tmp_path / "one"), timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = load_records(tmp_path / "one")
    assert len(records) == 2 and all(r.ok and r.model == "smol-b" for r in records), records
