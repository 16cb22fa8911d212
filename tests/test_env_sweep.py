"""The environment record of a sweep, and the drift guard of compare and gate, on built sysfs/procfs
trees: a stand-in llama-server changes the tree while it serves a chosen request, so the level that
request belongs to is the one whose machine changed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from loadgen.core.errors import EXIT_ENV_CHANGED
from machine_tree import build_tree, set_energy, set_link, set_rapl_limit
from servers import AppThread, in_process_cli

TOKENS = 16  # output tokens of every answer
COMPLETION = {"content": " x" * TOKENS, "stop": True, "stop_type": "limit", "tokens_predicted": TOKENS,
              "id_slot": 0, "timings": {"prompt_n": 8, "prompt_ms": 1.0, "predicted_n": TOKENS,
                                        "predicted_ms": 20.0, "predicted_per_second": 800.0, "cache_n": 0}}
PROPS = {"total_slots": 4, "model_alias": "env-stand-in", "build_info": "b1-test", "model_path": "m.gguf",
         "default_generation_settings": {"n_ctx": 4096}}


class StandIn(AppThread):
    """/health, /props and /completion (each answer after `delay_s`); `on_request(n)` runs as the
    n-th completion (1-based) arrives, before it is answered."""

    def __init__(self, on_request: Callable[[int], None] = lambda n: None, delay_s: float = 0.05):
        super().__init__()
        self.on_request, self.delay_s, self.count = on_request, delay_s, 0

    def app(self):
        from aiohttp import web

        async def completion(request: web.Request) -> web.Response:
            await request.read()
            self.count += 1
            self.on_request(self.count)
            await asyncio.sleep(self.delay_s)
            return web.json_response(COMPLETION)

        async def health(request: web.Request) -> web.Response:
            return web.json_response({"status": "ok"})

        async def props(request: web.Request) -> web.Response:
            return web.json_response(PROPS)

        app = web.Application()
        app.router.add_get("/health", health)
        app.router.add_get("/props", props)
        app.router.add_post("/completion", completion)
        return app


@pytest.fixture
def loadgen(monkeypatch, capsys):
    return in_process_cli(monkeypatch, capsys)


def sweep(loadgen, url: str, tree: tuple[Path, Path], out: Path, *extra: str) -> dict:
    code, _, err = loadgen("sweep", "--url", url, "--concurrency", "1,2", "--requests", "6", "--warmup", "0",
                           "--probe-interval", "0", "--sysfs", tree[0], "--procfs", tree[1],
                           "--env-interval", "0.05", "--output", out, "--format", "json", *extra)
    assert code == 0, err
    return json.loads((out / "run.json").read_text())


def test_a_sweep_records_the_machine_and_flags_the_level_it_changed_under(tmp_path, loadgen):
    tree = build_tree(tmp_path / "m", gpu_link=(4, 16))
    # Level 1 (c=1) serves completions 1-6, level 2 (c=2) 7-12: the link drops during level 2.
    with StandIn(lambda n: set_link(tree[0], 3, 16) if n == 9 else None) as server:
        doc = sweep(loadgen, server.origin, tree, tmp_path / "run")
    env = doc["environment"]
    assert env["cpu"]["model"] == "Test CPU 9000" and env["kernel"] == "6.1.0-test"
    assert env["server"][next(iter(env["server"]))]["build_info"] == "b1-test"
    first, second = doc["targets"][0]["levels"]
    assert len(first["environment"]) >= 2 and len(second["environment"]) >= 2  # start and end at least
    assert first["environment_changed"] == []
    assert len(second["environment_changed"]) == 1
    assert "PCI 0000:01:00.0: PCIe Gen4 x16 → Gen3 x16" in second["environment_changed"][0]
    code, out, err = loadgen("analyze", tmp_path / "run")
    flagged = [line for line in err.splitlines() if "the machine changed during the level" in line]
    assert code == 0 and len(flagged) == 1 and "at level 2" in flagged[0] and "Gen3 x16" in flagged[0], err


def test_compare_and_gate_refuse_runs_whose_links_differ(tmp_path, loadgen):
    base_tree = build_tree(tmp_path / "a", gpu_link=(4, 16))
    cand_tree = build_tree(tmp_path / "b", gpu_link=(3, 16))
    with StandIn() as server:
        sweep(loadgen, server.origin, base_tree, tmp_path / "base")
        sweep(loadgen, server.origin, cand_tree, tmp_path / "cand")
        sweep(loadgen, server.origin, base_tree, tmp_path / "same")
    for command in ("compare", "gate"):
        code, out, err = loadgen(command, tmp_path / "base", tmp_path / "cand")
        assert code == EXIT_ENV_CHANGED, (command, out, err)
        assert "baseline PCIe Gen4 x16; candidate levels 1, 2: PCIe Gen3 x16" in err, err
        assert "--allow-env-change" in err and "Traceback" not in err
        code, out, err = loadgen(command, tmp_path / "base", tmp_path / "cand", "--allow-env-change")
        assert code in (0, 3), (command, err)  # 3: one run a side enforces no limit; never the refusal
        assert "Gen3 x16" in err
    code, out, err = loadgen("compare", tmp_path / "base", tmp_path / "same")
    assert code == 0 and "environment" not in err, err


def test_energy_per_token_is_exact_with_counters_advancing_by_request(tmp_path, loadgen):
    """The stand-in adds 2 J to the RAPL package counter with every completion (and none while
    idle), so every level's gross and net J/token are 2 J / 16 tokens = 0.125 exactly."""
    tree = build_tree(tmp_path / "m", rapl_uj=1_000_000)
    energy = {"uj": 1_000_000}

    def spend(n: int) -> None:
        energy["uj"] += 2_000_000
        set_energy(tree[0], energy["uj"])
    with StandIn(spend) as server:
        doc = sweep(loadgen, server.origin, tree, tmp_path / "run", "--idle-power", "0.2")
    assert doc["environment"]["idle_power_w"] == {"cpu": 0.0}
    for level in doc["targets"][0]["levels"]:
        (cpu,) = level["energy"]
        assert cpu["source"] == "cpu" and cpu["energy_j"] == pytest.approx(12.0)  # 6 requests x 2 J
        assert cpu["j_per_token"] == pytest.approx(0.125) and cpu["net_j_per_token"] == pytest.approx(0.125)
        assert cpu["tokens_per_j"] == pytest.approx(8.0)
        assert cpu["mean_w"] == pytest.approx(12.0 / cpu["seconds"], rel=1e-4)  # both rounded to 6 places


def test_old_runs_without_an_environment_are_compared_with_a_note(tmp_path, loadgen):
    tree = build_tree(tmp_path / "m")
    with StandIn() as server:
        sweep(loadgen, server.origin, tree, tmp_path / "old", "--no-environment")
        sweep(loadgen, server.origin, tree, tmp_path / "new")
    old = json.loads((tmp_path / "old" / "run.json").read_text())
    assert "environment" not in old and "environment" not in old["targets"][0]["levels"][0]
    code, out, err = loadgen("compare", tmp_path / "old", tmp_path / "new")
    assert code == 0 and "no recorded environment" in err


# (--connections, --threads-http, expected warning): the stand-in has 4 slots, so llama-server's default
# threads are max(4 + 2, cores − 1) on the tree's 4 cores = 6; the probe adds 2 connections.
THREADS = [("4", None, None), ("5", None, "6 HTTP threads for 7 connections"), ("8", "10", None),
           ("9", "10", "10 HTTP threads for 11 connections")]


@pytest.mark.parametrize("connections,threads,expected", THREADS)
def test_env_warns_about_too_few_http_threads(tmp_path, loadgen, connections, threads, expected):
    sysfs, procfs = build_tree(tmp_path / "m")
    with StandIn() as server:
        code, out, err = loadgen("env", "--sysfs", sysfs, "--procfs", procfs, "--interval", "0", "--url",
                                 server.origin, "--connections", connections,
                                 *(("--threads-http", threads) if threads else ()))
    assert code == 0 and "build b1-test, model m.gguf, 4 slots of 4096 tokens" in out
    warnings = [line for line in err.splitlines() if "HTTP threads" in line]
    assert (warnings[0] if warnings else None) == (f"warning: the server has {expected}: start it with "
                                                   f"--threads-http {int(connections) + 2} or more, or open fewer "
                                                   f"connections." if expected else None)


def test_a_level_whose_power_limit_changed_is_left_out_of_the_comparison(tmp_path, loadgen):
    """thermald sets the cap back during the candidate's level 2 (completion 9 of 12): the start
    fingerprints agree, so nothing refuses, but level 2 is left out unless --allow-env-change."""
    base = build_tree(tmp_path / "a", rapl_uj=0, rapl_limit_w=241, rapl_max_w=241)
    cand = build_tree(tmp_path / "b", rapl_uj=0, rapl_limit_w=241, rapl_max_w=241)
    with StandIn() as server:
        sweep(loadgen, server.origin, base, tmp_path / "base", "--idle-power", "0")
    with StandIn(lambda n: set_rapl_limit(cand[0], 100) if n == 9 else None) as server:
        doc = sweep(loadgen, server.origin, cand, tmp_path / "cand", "--idle-power", "0")
    assert [bool(lv["environment_changed"]) for lv in doc["targets"][0]["levels"]] == [False, True]
    code, out, err = loadgen("compare", tmp_path / "base", tmp_path / "cand", "--format", "json")
    assert code == 0, err
    assert "left out: " in err and "at level 2 of the candidate" in err
    assert [row["concurrency"] for row in json.loads(out)["levels"]] == [1]
    code, out, err = loadgen("compare", tmp_path / "base", tmp_path / "cand", "--format", "json",
                             "--allow-env-change")
    assert code == 0 and "left out" not in err
    assert [row["concurrency"] for row in json.loads(out)["levels"]] == [1, 2]
