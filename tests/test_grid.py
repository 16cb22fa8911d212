"""`loadgen grid`: cells, order, boot-log facts, the summary, and the failure table against a
stand-in server (tests/fake-llama-server.py): every failure recorded, no server left behind (by pid)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time

import pytest

from loadgen.analysis.bootlog import boot_facts
from loadgen.analysis.grid_cells import (
    cache_flags,
    check_template,
    cross,
    kv_warnings,
    parse_param,
    run_order,
    summarize_cell,
    who_wins,
)
from loadgen.core.errors import ConfigError
from loadgen.core.processes import pid_alive
from servers import GRID_SERVER, LOADGEN, grid, grid_pids

# Lines of the test bed's boot log (llama-server 11434, SmolLM2-135M, -c 2048 --parallel 2 -lv 4).
BOOT_LOG = """\
0.00.003.507 I cmn  common_param: common_params_print_info: build 0 (unknown) with GNU 12.2.0 for Linux x86_64
0.00.005.410 I srv          init: using 5 threads for HTTP server
0.00.172.582 I llama_context: n_seq_max             = 2
0.00.172.595 I llama_context: n_ctx                 = 2048
0.00.172.607 I llama_context: n_ctx_seq             = 1024
0.00.172.670 I llama_context: kv_unified            = false
0.00.172.852 I llama_kv_cache:        CPU KV buffer size =    45.00 MiB
0.00.196.436 I llama_kv_cache: size =   45.00 MiB (  1024 cells,  30 layers,  2/2 seqs), K (f16):   22.50 MiB, V (f16):   22.50 MiB
0.00.240.163 I srv    load_model: initializing, n_slots = 2, n_ctx_slot = 1024, kv_unified = 'false'
"""


def test_boot_facts_at_lv4():
    f = boot_facts(BOOT_LOG)
    assert (f.n_slots, f.n_ctx_slot, f.n_seq_max, f.n_ctx, f.n_ctx_seq, f.kv_unified) == (2, 1024, 2, 2048, 1024, False)
    assert f.kv_size_mib == 45.0
    assert (f.kv_caches[0].cells, f.kv_caches[0].layers, f.kv_caches[0].streams) == (1024, 30, 2)
    assert f.build == "0 (unknown)"
    assert f.http_threads == 5


def test_boot_facts_at_the_default_verbosity():
    """Below -lv 4 only the server's `initializing` line is there: no KV size."""
    f = boot_facts(BOOT_LOG.splitlines()[-1])
    assert (f.n_slots, f.n_ctx_slot, f.kv_unified, f.kv_size_mib, f.n_ctx) == (2, 1024, False, None, None)


def test_cells_cross_and_interleave():
    params = [parse_param("model=a.gguf,b.gguf"), parse_param("parallel=1,2,4")]
    cells = cross(params)
    assert len(cells) == 6
    assert cells[0] == {"model": "a.gguf", "parallel": "1"} and cells[3] == {"model": "b.gguf", "parallel": "1"}
    assert run_order(3, 2) == [(1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2)]  # A B C, A B C


@pytest.mark.parametrize("template, params, message", [
    ("llama-server -np {parallel}", [], "no --param parallel"),
    ("llama-server -np 2", ["parallel=1,2"], "not used in --server"),
    ("llama-server -np {parallel}", ["parallel=1", "parallel=2"], "given twice"),
    ("llama-server -np {}", [], "placeholders are names"),
    ("vllm serve m --port {port}", ["port=8000,8001"], "grid fills {port} itself"),
])
def test_template_checks(template, params, message):
    with pytest.raises(ConfigError, match=message):
        check_template(template, [parse_param(p) for p in params])


@pytest.mark.parametrize("text", ["parallel", "parallel=", "parallel=1,,2", "=1,2", "parallel=1,1"])
def test_bad_params(text):
    with pytest.raises(ConfigError):
        parse_param(text)


# A llama-server argv -> (n_ctx, parallel, unified, type_k, model); unset --parallel is auto: 4 unified slots.
CACHE_FLAGS = [
    ("llama-server -m m.gguf -c 2048 --parallel 2", (2048, 2, False, "f16", "m.gguf")),
    ("llama-server --model=m.gguf --ctx-size=8192", (8192, 4, True, "f16", "m.gguf")),
    ("llama-server -m m.gguf -np 4 -kvu -ctk q8_0", (0, 4, True, "q8_0", "m.gguf")),
    ("llama-server -hf x/y -no-kvu", (0, 4, False, "f16", None)),
]


@pytest.mark.parametrize("argv, expected", CACHE_FLAGS)
def test_cache_flags(argv, expected):
    f = cache_flags(argv.split())
    assert (f.n_ctx, f.n_parallel, f.unified, f.type_k, f.model) == expected


def _run(*throughputs, latency=100.0):
    """A grid entry whose run.json has a level per throughput (c=1, 2, 4), mean latency `latency` × c."""
    def dist(mean):
        return {"count": 1, "mean": mean, "p50": mean, "p90": mean, "p99": mean, "max": mean}

    levels = [{"level": lv, "concurrency": lv, "requests_ok": 1, "requests_failed": 0, "output_tokens": 1,
               "wall_s": 1.0, "throughput_tok_s": t, "predicted_ms_mean": None, "decode_tok_s_mean": None,
               "latency_ms": dist(latency * lv)} for lv, t in zip((1, 2, 4), throughputs)]
    return {"status": "ok", "run": {"targets": [{"label": "cell", "levels": levels, "verdict": {"saturated_at": 2}}]}}


def test_summary_mean_sd_and_who_wins():
    one = summarize_cell("parallel=1", {"parallel": "1"}, [_run(20, 30, 31), _run(22, 30, 33)])
    four = summarize_cell("parallel=4", {"parallel": "4"}, [_run(15, 24, 25), _run(15, 26, 25),
                                                             {"status": "failed", "reason": "boom"}])
    assert (one.single_stream_tok_s.mean, one.single_stream_tok_s.sd) == (21, pytest.approx(2 ** 0.5))
    assert (one.peak_tok_s.mean, one.peak_at, one.saturated_at) == (32, 4, 2)
    assert (four.runs_ok, four.runs, four.failure) == (2, 3, "boom")
    lines = who_wins([one, four])
    assert "parallel=1 has the highest throughput at every level here (1, 2, 4)" in lines
    assert any(line.startswith("highest single-stream throughput (tok/s): parallel=1 (21.0; +40%") for line in lines)


# (boot facts, loadgen's estimate, its note) of a cell's run -> the warning lines (written before running)
KV_WARNINGS = [
    ({"kv_size_mib": 45.0}, {"kv_mib": 45.0}, None, []),
    ({"kv_size_mib": 45.004}, {"kv_mib": 45.0}, None, []),  # equal to the hundredth
    ({"kv_size_mib": 1.25}, {"kv_mib": 4.0}, None,
     ["c: the boot log's KV cache is 1.25 MiB but loadgen kv estimated 4.00 MiB; the log is what the server "
      "allocated"]),
    ({"kv_size_mib": 0.25, "recurrent_mib": 0.07}, {"kv_mib": 0.25, "recurrent_mib": 0.08}, None,
     ["c: the boot log's recurrent state is 0.07 MiB but loadgen kv estimated 0.08 MiB; the log is what the "
      "server allocated"]),
    ({"kv_size_mib": 0.5}, None, "architecture 'x' is unknown to this loadgen",
     ["c: the boot log's KV cache is 0.50 MiB; loadgen kv gave no figure (architecture 'x' is unknown to this "
      "loadgen)"]),
    ({}, {"kv_mib": 4.0}, None, []),  # no -lv 4: nothing to check against
]


@pytest.mark.parametrize("boot, estimate, note, expected", KV_WARNINGS)
def test_kv_mismatch_is_a_warning_with_both_figures(boot, estimate, note, expected):
    cell = summarize_cell("c", {}, [{"status": "ok", "boot": boot, "kv_estimate": estimate, "kv_estimate_note": note}])
    assert kv_warnings([cell]) == expected


def _grid_doc(folder):
    return json.loads((folder / "grid.json").read_text())


SWEEP = ("--concurrency", "1,2", "--requests", "4", "--n-predict", "8", "--warmup", "1")


def test_failure_table(tmp_path):
    """One grid, four cells: a good one, a bad flag, a server that dies mid-sweep, one never healthy."""
    out = tmp_path / "grid"
    proc = grid("--server", f"{GRID_SERVER} {{case}}", "--param",
                "case=--seed=1,--no-such-flag,--die-after=5,--load-forever", "--wait-ready", "10",
                *SWEEP, "--output", str(out))
    assert proc.returncode == 1, proc.stderr
    runs = [c["runs"][0] for c in _grid_doc(out)["cells"]]
    assert [r["status"] for r in runs] == ["ok", "failed", "failed", "failed"]
    assert "exited with code 1 before it was healthy" in runs[1]["reason"]
    # the server's own line on why, as llama-server words a bad flag
    assert runs[1]["reason"].endswith("error: invalid argument: unrecognized arguments: --no-such-flag"), runs[1]
    assert any("no-such-flag" in line for line in runs[1]["log_tail"])
    assert "exited with code 3 during the measurement" in runs[2]["reason"]
    assert any("simulated crash" in line for line in runs[2]["log_tail"])
    assert "not healthy within --wait-ready 10 s" in runs[3]["reason"]
    assert runs[0]["boot"]["n_slots"] == 2 and runs[0]["boot"]["kv_size_mib"] == 45.0
    assert (out / runs[0]["run_dir"] / "run.json").is_file()
    pids = grid_pids(out)
    assert len(pids) == 4 and not any(pid_alive(p) for p in pids)
    assert "case=--no-such-flag: the server exited with code 1 before it was healthy" in proc.stdout


def test_grid_over_loadgen_sim(tmp_path):
    """A server that is not llama-server (`loadgen sim`) is gridded: grid adds no -lv 4 (the simulator
    refuses the flag), every cell is measured, and its boot facts are simply absent. Its port is where
    the template writes {port}, within --port-range."""
    out = tmp_path / "grid"
    low = 20000 + os.getpid() % 20000
    proc = grid("--server", f"{shlex.join(LOADGEN)} sim --profile smoke --time-scale 0.05 --slots {{slots}} "
                            "--port {port}", "--param", "slots=1,2", "--port-range", f"{low}-{low + 50}",
                *SWEEP, "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    runs = [c["runs"][0] for c in _grid_doc(out)["cells"]]
    assert all(low <= int(r["url"].rsplit(":", 1)[1]) <= low + 50 and r["command"].count("--port") == 1
               for r in runs), runs
    assert [r["status"] for r in runs] == ["ok", "ok"], runs
    assert all((r.get("boot") or {}).get("kv_size_mib") is None for r in runs), runs
    assert all((out / r["run_dir"] / "run.json").is_file() for r in runs)
    assert not any(pid_alive(p) for p in grid_pids(out))


def test_resume_runs_only_what_is_left(tmp_path, loadgen):
    out = tmp_path / "grid"
    proc = grid("--server", f"{GRID_SERVER} --parallel {{parallel}}", "--param", "parallel=1,2,3", *SWEEP,
                "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    doc = _grid_doc(out)
    first = doc["cells"][0]["runs"][0]["started_utc"]
    for cell in doc["cells"][1:]:  # as if the grid had been stopped after its first cell
        cell["runs"] = []
    (out / "grid.json").write_text(json.dumps(doc))
    proc = grid("--resume", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "grid 1/2: c02" in proc.stderr and "c01" not in proc.stderr.split("loadgen grid")[0]
    doc = _grid_doc(out)
    assert doc["cells"][0]["runs"][0]["started_utc"] == first
    assert [c["runs"][0]["status"] for c in doc["cells"]] == ["ok", "ok", "ok"]
    code, stdout, _ = loadgen("analyze", out)  # reprints the summary
    assert code == 0 and "parallel" in stdout and "loadgen grid" in stdout
    code, stdout, _ = loadgen("report", out, "--format", "markdown")  # the cells overlaid
    assert code == 0 and all(f"## c0{i} parallel={i}: server" in stdout for i in (1, 2, 3))


def test_ctrl_c_during_a_cell(tmp_path):
    """SIGINT while a cell's sweep runs: the sweep stops, the server is stopped, no further cell starts."""
    out = tmp_path / "grid"
    proc = subprocess.Popen([*LOADGEN, "grid", "--server", f"{GRID_SERVER} --parallel {{parallel}}", "--param",
                             "parallel=1,2", "--concurrency", "1", "--duration", "120", "--warmup", "0",
                             "--output", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        log = out / "cells" / "c01" / "r1" / "server.log"
        deadline = time.monotonic() + 120
        while not log.exists() or "completion request 1" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, "the first cell's sweep never started"
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    doc = _grid_doc(out)
    assert doc["cells"][0]["runs"][0]["status"] == "interrupted" and doc["cells"][1]["runs"] == []
    assert not any(pid_alive(p) for p in grid_pids(out))
    assert "--resume" in stderr


@pytest.mark.parametrize("args, message", [
    (("--param", "x=1"), "--server"),
    (("--server", "llama-server -np {parallel}"), "no --param parallel"),
    (("--server", "llama-server -np {p}", "--param", "p=1", "--url", "http://x"), "set by grid itself"),
    (("--server", "llama-server -np {p}", "--param", "p=1", "--concurrency", "0"), "sweep options"),
    (("--server", "sim --port {port}", "--port-range", "9000"), "write FIRST-LAST"),
    (("--server", "sim --port {port}", "--port-range", "9010-9000"), "write FIRST-LAST"),
])
def test_bad_input(loadgen, tmp_path, args, message):
    code, _, err = loadgen("grid", *args, "--output", tmp_path / "g")
    assert code == 2, err
    assert message in err and len(err.strip().splitlines()) == 1


@pytest.mark.real
def test_real_grid_kv_matches_the_boot_log(tmp_path):
    """The test bed: --parallel 1,2 × -ctk f16,q8_0 at -c 2048; each cell's KV size from its boot log
    equals `loadgen kv`'s estimate to the hundredth of a MiB, and no server is left (by pid)."""
    from servers import testbed_paths

    server, model = testbed_paths()
    out = tmp_path / "grid"
    proc = grid("--server", f"{server} -m {model} -c 2048 --parallel {{parallel}} -ctk {{ctk}} -t 1 --metrics",
                "--param", "parallel=1,2", "--param", "ctk=f16,q8_0", "--concurrency", "1,2", "--requests", "2",
                "--n-predict", "8", "--warmup", "0", "--wait-ready", "120", "--output", str(out), timeout=900)
    assert proc.returncode == 0, proc.stderr
    cells = _grid_doc(out)["cells"]
    assert len(cells) == 4
    logged = {}
    for cell in cells:
        run = cell["runs"][0]
        assert run["status"] == "ok", run.get("reason")
        assert f"{run['boot']['kv_size_mib']:.2f}" == f"{run['kv_estimate']['kv_mib']:.2f}"
        assert run["boot"]["n_slots"] == int(cell["params"]["parallel"])
        logged[cell["name"]] = run["boot"]["kv_size_mib"]
    assert logged["parallel=2 ctk=f16"] == 45.00  # 1024 cells × 2 streams, 30 layers
    assert logged["parallel=1 ctk=q8_0"] == 34.45  # K 22.50 × 17/32 = 11.95 (34 bytes per 32) + V 22.50
    assert not any(pid_alive(p) for p in grid_pids(out))
    assert "= est" in proc.stdout


# template -> what loadgen adds or keeps: its own loopback port unless the template sets one, and -lv 4
# where the template runs llama-server (a word's file name holds "llama-server") and sets no verbosity.
SERVER_ARGV = [
    ("llama-server -m m.gguf", lambda argv, url: argv[-2:] == ["-lv", "4"] and "--port" in argv and url.startswith(
        "http://127.0.0.1:")),
    ("llama-server --port 9001 --host=0.0.0.0 -lv 2", lambda argv, url: url == "http://0.0.0.0:9001" and
     "4" not in argv),
    ("llama-server --port=9002 -v", lambda argv, url: url == "http://127.0.0.1:9002" and "-lv" not in argv),
    ("/opt/llama.cpp/build/bin/llama-server -m m.gguf", lambda argv, url: argv[-2:] == ["-lv", "4"]),
    ("taskset -c 0-3 ./llama-server -m m.gguf", lambda argv, url: argv[-2:] == ["-lv", "4"]),
    ("python3 tests/fake-llama-server.py", lambda argv, url: argv[-2:] == ["-lv", "4"]),
    ("loadgen sim --slots 2", lambda argv, url: "-lv" not in argv and argv[-4:-2] == ["--port", argv[-3]]),
    ("vllm serve m --port 9003", lambda argv, url: "-lv" not in argv and url == "http://127.0.0.1:9003"),
    ("python3 -m sglang.launch_server --model-path m", lambda argv, url: "-lv" not in argv),
    ("vllm serve m --served-model-name=llama-server", lambda argv, url: "-lv" not in argv),  # a flag's value
    # {port} and {host}: grid's free loopback port and address where the template puts them, no --port added
    ("loadgen sim --port {port}", lambda argv, url: argv[:3] == ["loadgen", "sim", "--port"] and argv[3] != "0"
     and url == f"http://127.0.0.1:{argv[3]}" and argv.count("--port") == 1 and argv[-2:] == ["--host", "127.0.0.1"]),
    ("server -p {port} -a {host}", lambda argv, url: argv[:2] == ["server", "-p"] and argv[3:] == ["-a", "127.0.0.1"]
     and url == f"http://127.0.0.1:{argv[2]}" and "--port" not in argv and "--host" not in argv),
]


@pytest.mark.parametrize("template, holds", SERVER_ARGV)
def test_server_argv(template, holds):
    from loadgen.cli.grid import server_argv

    argv, url = server_argv(template, {})
    assert holds(argv, url), (argv, url)


def test_a_port_range_bounds_the_ports_grid_picks(tmp_path):
    import socket

    from loadgen.cli.grid import server_argv
    from loadgen.run.servers import ServerStartError, free_port

    first = free_port()
    first = first if first + 3 <= 65535 else first - 3
    seen = {int(server_argv("loadgen sim --port {port}", {}, (first, first + 3))[1].rsplit(":", 1)[1])
            for _ in range(40)}
    assert seen <= set(range(first, first + 4)) and len(seen) > 1  # a random start: a retry gets another
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", first))
        taken.listen()
        with pytest.raises(ServerStartError, match=f"no free port in --port-range {first}-{first}"):
            free_port(within=(first, first))
        # a template that gives its own --port never needs the range
        argv, url = server_argv("vllm serve m --port 9003", {}, (first, first))
        assert url == "http://127.0.0.1:9003" and argv.count("--port") == 1


def test_scenario_file_with_mode_grid(tmp_path, loadgen):
    """A scenario's grid keys go to the grid, the others to its measurement, each checked by its option."""
    out = tmp_path / "grid"
    scenario = tmp_path / "grid.toml"
    scenario.write_text(f'''mode = "grid"
server = "{GRID_SERVER} --parallel {{parallel}}"
param = ["parallel=1,2"]
concurrency = [1, 2]
requests = 4
n_predict = 8
warmup = 1
stream = true
output = "{out}"
''')
    code, stdout, err = loadgen("run", scenario, "--check")
    assert code == 0 and "all valid" in stdout, err
    assert not out.exists()
    proc = subprocess.run([*LOADGEN, "run", str(scenario)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    doc = _grid_doc(out)
    assert doc["measure_args"] == ["--concurrency", "1,2", "--requests", "4", "--n-predict", "8", "--warmup", "1",
                                   "--stream"]
    assert [c["runs"][0]["status"] for c in doc["cells"]] == ["ok", "ok"]
    scenario.write_text(scenario.read_text().replace("n_predict", "n_predikt"))
    code, _, err = loadgen("run", scenario, "--check")
    assert code == 2 and "grid.toml:6: n_predikt: unknown key" in err
