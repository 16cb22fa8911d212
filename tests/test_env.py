"""`loadgen env` and the machine reader: a built sysfs/procfs tree read back, and the pre-flight warnings
decided on a table of trees whose expected warnings are written down first."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from loadgen.analysis.env_drift import level_changes, preflight_warnings
from loadgen.cli.main import cli
from loadgen.client.machine_facts import MachineReader, Roots, parse_smi_csv
from machine_tree import build_tree, set_cpu_times, set_link, set_temperature


def run_env(*args: str):
    return CliRunner().invoke(cli, ["env", "--interval", "0", *args], catch_exceptions=False)


def test_this_machine_prints_cpu_memory_kernel_and_no_gpu():
    result = run_env()
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "CPU: " in out and "logical cores" in out
    assert "memory: " in out and "MiB" in out
    assert "kernel " in out and "kernel unknown" not in out
    assert "no GPU" in out  # the test machine has none; a GPU machine prints its GPUs instead


def test_a_built_tree_reads_back(tmp_path):
    sysfs, procfs = build_tree(tmp_path, cores=6, gpu_link=(4, 16), rapl_uj=5_000_000, rapl_limit_w=100,
                               rapl_max_w=125)
    fp = MachineReader(Roots(sysfs, procfs)).fingerprint()
    assert (fp.cpu.model, fp.cpu.logical_cores, fp.cpu.min_mhz, fp.cpu.max_mhz) == ("Test CPU 9000", 6, 1000, 4000)
    assert fp.sample.governors == ("performance",) and fp.sample.turbo is True
    assert fp.kernel == "6.1.0-test" and fp.memory.total_mib == 16384 and fp.memory.swap_total_mib == 4096
    gpu = [link for link in fp.sample.links if link.is_accelerator]
    assert [(g.address, g.gen, g.width, g.max_gen, g.max_width) for g in gpu] == [("0000:01:00.0", 4, 16, 4, 16)]
    assert [(z.name, z.energy_uj, z.limits_w, z.max_w) for z in fp.sample.rapl] == \
        [("package-0", 5_000_000, {"long_term": 100.0}, {"long_term": 125.0})]
    assert fp.sample.gpus == () and fp.gpu_source is None  # a tree's GPUs are never the live machine's


def build_hwmon(sysfs) -> None:
    """Three chips as a desktop has them (the numbering is the kernel's load order, not the names')."""
    set_temperature(sysfs, 0, 1, 45.5, chip="coretemp", label="Package id 0")
    set_temperature(sysfs, 0, 2, 44.0, label="Core 0")
    set_temperature(sysfs, 0, 10, 43.0, label="Core 8")
    set_temperature(sysfs, 1, 1, 38.85, chip="nvme")
    set_temperature(sysfs, 10, 1, 27.8, chip="acpitz")


# By chip name, then K of tempK (temp10 after temp2); a sensor without a label is "tempK".
HWMON = [("acpitz", "temp1", 27.8), ("coretemp", "Package id 0", 45.5), ("coretemp", "Core 0", 44.0),
         ("coretemp", "Core 8", 43.0), ("nvme", "temp1", 38.85)]


def test_hwmon_temperatures_are_read_through_the_sysfs_root(tmp_path, loadgen):
    sysfs, procfs = build_tree(tmp_path)
    assert MachineReader(Roots(sysfs, procfs)).sample(0.0).temperatures == ()  # a VM has no hwmon
    build_hwmon(sysfs)
    sample = MachineReader(Roots(sysfs, procfs)).sample(0.0)
    assert [(t.chip, t.sensor, t.celsius) for t in sample.temperatures] == HWMON
    code, out, err = loadgen("env", "--sysfs", sysfs, "--procfs", procfs, "--interval", "0")
    assert code == 0 and "temperatures coretemp: Package id 0 45.5 °C, Core 0 44 °C, Core 8 43 °C" in out, err


# Each row: tree settings, then the warnings expected (by a word each), written before running.
PREFLIGHT = [
    ("clean", {"gpu_link": (4, 16)}, {}, []),
    ("gen3 of gen4", {"gpu_link": (3, 16)}, {}, ["Gen3 x16 (max Gen4 x16)"]),
    ("x8 of x16", {"gpu_link": (4, 8)}, {}, ["Gen4 x8 (max Gen4 x16)"]),
    ("powersave", {"governor": "powersave"}, {}, ["governor is powersave"]),
    ("swap", {"swap_used_kb": 2048 * 1024}, {}, ["2048 MiB of swap"]),
    ("rapl cap", {"rapl_uj": 0, "rapl_limit_w": 100, "rapl_max_w": 241}, {}, ["long_term 100 W of 241 W"]),
    ("rapl at max", {"rapl_uj": 0, "rapl_limit_w": 241, "rapl_max_w": 241}, {}, []),
    ("steal 5%", {}, {"steal": 5_000}, ["5.0% of CPU time stolen"]),
    ("steal 1%", {}, {"steal": 1_000}, []),
    ("threads", {}, {"connections": 10, "http_threads": 8}, ["8 HTTP threads for 10 connections"]),
    ("threads enough", {}, {"connections": 8, "http_threads": 8}, []),
]


@pytest.mark.parametrize("settings,later,expected", [p[1:] for p in PREFLIGHT], ids=[p[0] for p in PREFLIGHT])
def test_preflight_warnings(tmp_path, settings, later, expected):
    sysfs, procfs = build_tree(tmp_path, **settings)
    reader = MachineReader(Roots(sysfs, procfs))
    fp = reader.fingerprint()
    if "steal" in later:  # 100,000 more jiffies, `steal` of them stolen
        set_cpu_times(procfs, total=200_000, steal=later["steal"])
    warnings = preflight_warnings(fp, reader.sample(1.0), connections=later.get("connections"),
                                  http_threads=later.get("http_threads"))
    assert len(warnings) == len(expected), warnings
    for line, word in zip(warnings, expected):
        assert word in line and "\n" not in line


def test_env_warns_one_line_for_a_gen3_link_of_a_gen4_maximum(tmp_path):
    sysfs, procfs = build_tree(tmp_path, gpu_link=(3, 16))
    result = run_env("--sysfs", str(sysfs), "--procfs", str(procfs))
    assert result.exit_code == 0
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "Gen3 x16 (max Gen4 x16)" in warnings[0]
    assert "PCI 0000:01:00.0 (class 0x030200): PCIe Gen3 x16 (max Gen4 x16)" in result.stdout


def test_env_json_and_a_missing_root(tmp_path):
    sysfs, procfs = build_tree(tmp_path)
    result = run_env("--sysfs", str(sysfs), "--procfs", str(procfs), "--format", "json")
    assert json.loads(result.stdout)["fingerprint"]["cpu"]["logical_cores"] == 4
    bad = run_env("--sysfs", str(tmp_path / "nowhere"))
    assert bad.exit_code == 2 and "no such directory" in bad.output and "Traceback" not in bad.output


def test_a_level_whose_link_downshifts_is_flagged(tmp_path):
    sysfs, procfs = build_tree(tmp_path, gpu_link=(4, 16))
    reader = MachineReader(Roots(sysfs, procfs))
    first = reader.sample(0.0)
    assert level_changes([first, reader.sample(1.0)]) == []
    set_link(sysfs, 3, 16)
    changes = level_changes([first, reader.sample(2.0)])
    assert changes == ["PCI 0000:01:00.0: PCIe Gen4 x16 → Gen3 x16 at 2.0 s"]


def test_nvidia_smi_csv():
    row = ("0, NVIDIA GeForce RTX 3090, 00000000:01:00.0, 550.54, 3, 4, 16, 16, 280.00, 350.00, 271.5, 1695, 9751, "
           "0x0000000000000004, 71, 23000\n")
    (gpu,) = parse_smi_csv(row)
    assert (gpu.pcie_gen, gpu.pcie_max_gen, gpu.pcie_width, gpu.power_limit_w, gpu.power_default_limit_w) == \
        (3, 4, 16, 280.0, 350.0)
    assert gpu.throttle_reasons == ("sw_power_cap",) and gpu.source == "nvidia-smi"
    (na,) = parse_smi_csv(row.replace("271.5", "[N/A]"))
    assert na.power_draw_w is None


def test_nvml_reads_without_a_gpu():
    pytest.importorskip("pynvml")
    from loadgen.client.machine_facts import read_nvml
    gpus = read_nvml()
    assert gpus is None or all(g.source == "nvml" for g in gpus)


def test_a_server_that_does_not_answer_is_one_warning_not_none_fields(loadgen):
    code, out, err = loadgen("env", "--interval", "0", "--url", "http://127.0.0.1:1")
    assert code == 0 and "None" not in out and "server http://127.0.0.1:1" not in out
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "http://127.0.0.1:1 did not answer" in warnings[0], err
    assert "is the server up" in warnings[0]


def serve_metrics(text: str):
    """A /metrics of `text` on a free loopback port, in a thread: (server, its URL)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = text.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/metrics"


LLAMA_METRICS = ("# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.\n"
                 "# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 42\n")


def test_a_telemetry_url_without_exporter_metrics_is_one_warning(loadgen):
    server, url = serve_metrics(LLAMA_METRICS)
    try:
        code, out, err = loadgen("env", "--interval", "0", "--telemetry-url", url)
    finally:
        server.shutdown()
    assert code == 0 and "None" not in out
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and url in warnings[0] and "no node_exporter or DCGM" in warnings[0], err


def test_an_empty_tree_prints_unknown_never_none_or_zero(tmp_path, loadgen):
    (tmp_path / "sys").mkdir()
    (tmp_path / "proc").mkdir()
    code, out, err = loadgen("env", "--sysfs", tmp_path / "sys", "--procfs", tmp_path / "proc", "--interval", "0")
    assert code == 0, err
    assert "None" not in out and "0 logical cores" not in out
    assert "CPU: unknown, unknown logical cores" in out
    assert "memory: unknown, unknown available; swap unknown, unknown used" in out
