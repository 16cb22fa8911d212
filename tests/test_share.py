"""`loadgen share`: runs bundled with this machine's names, paths, addresses and secrets redacted.
The redaction on a table of strings whose expected results were written down before the code ran;
then a run of the simulator bundled, and the bundle grepped for this machine's host name, user name
and folders."""

from __future__ import annotations

import getpass
import json
import socket
import tarfile

import pytest

from loadgen.results.share import Redactor
from servers import SimThread


@pytest.mark.parametrize("text, expected", [
    ("/srv/alice/models/SmolLM2.gguf", "<path>/SmolLM2.gguf"),
    ("model at /opt/cache/loadgen/x.gguf loaded", "model at <path>/x.gguf loaded"),
    ("http://10.1.2.3:8080/v1", "http://<ip>:8080/v1"),
    ("http://127.0.0.1:8080", "http://127.0.0.1:8080"),  # loopback names no machine
    ("http://[::1]:8080", "http://[::1]:8080"),
    ("Bearer abcdef123456", "Bearer <secret>"),
    ("key sk-abcdefghijkl", "key <secret>"),
    ("myhost.example", "<host>.example"),
    ("on myhost now", "on <host> now"),
    ("alice", "<user>"),
    ("malice", "malice"),  # a name inside another word is not the name
    ("build 1.2.3", "build 1.2.3"),
    ("version 1.2.3.4000", "version 1.2.3.4000"),  # not an address
    ("ttft=500ms,e2e=8s", "ttft=500ms,e2e=8s"),
    ("https://example.com/a/b", "https://example.com/a/b"),  # a URL's path is not a folder of this machine
])
def test_a_string_is_redacted_of_what_names_the_machine_and_its_people(text, expected):
    assert Redactor(hosts=("myhost",), users=("alice",)).text(text) == expected


def test_a_secret_key_is_redacted_whatever_it_holds_and_the_list_names_places_not_values():
    red = Redactor(hosts=("myhost",), users=("alice",))
    doc = red.value({"api_key": "xyz", "config": {"targets": [{"url": "http://192.168.1.9:80"}], "n": 3}})
    assert doc == {"api_key": "<secret>", "config": {"targets": [{"url": "http://<ip>:80"}], "n": 3}}
    report = red.report(["r/run.json"])
    assert "`.api_key`" in report and "`.config.targets[0].url`" in report
    assert "xyz" not in report and "192.168" not in report


def test_a_shared_run_holds_no_host_user_or_folder_of_this_machine(loadgen, tmp_path):
    run = tmp_path / "run"
    with SimThread(slots=2) as sim:
        code, _, err = loadgen("sweep", "--url", sim.url, "--concurrency", "1,2", "--requests", "8", "--n-predict", "8",
                               "--api-key", "sk-testsecret12345", "--output", run)
    assert code == 0, err
    out = tmp_path / "bundle.tar.gz"
    code, printed, err = loadgen("share", run, "--records", "--output", out)
    assert code == 0, err
    with tarfile.open(out) as tar:
        names = tar.getnames()
        text = "\n".join(tar.extractfile(m).read().decode() for m in tar.getmembers())  # type: ignore[union-attr]
    assert "run/run.json" in names and "run/requests.jsonl" in names and "REDACTED.md" in names
    raw = (run / "run.json").read_text()
    assert str(tmp_path) in raw or socket.gethostname() in raw  # the run names this machine: there is something to redact
    for leak in {str(tmp_path), str(tmp_path.parent), socket.gethostname(), "sk-testsecret12345"}:
        assert leak not in text, leak
    user = getpass.getuser()
    if user != "root":
        assert f"/{user}/" not in text and f" {user} " not in text
    summary = tar_member(out, "run/run.json")
    assert summary["targets"][0]["levels"][1]["requests_ok"] == 8  # the figures survive
    code, _, err = loadgen("share", tmp_path, "--output", tmp_path / "x.tar.gz")
    assert code == 2 and "no run.json" in err, err


def tar_member(path, name):
    with tarfile.open(path) as tar:
        return json.loads(tar.extractfile(name).read())  # type: ignore[union-attr]


def test_two_folders_of_one_name_are_both_kept(tmp_path):
    from loadgen.results.share import Redactor, bundle

    for parent in ("a", "b"):
        (tmp_path / parent / "run").mkdir(parents=True)
        (tmp_path / parent / "run" / "run.json").write_text(json.dumps({"targets": [], "side": parent}))
    names = bundle([tmp_path / "a" / "run", tmp_path / "b" / "run"], tmp_path / "x.tar.gz", redactor=Redactor())
    assert names == ["run/run.json", "run-2/run.json", "REDACTED.md"]
    assert tar_member(tmp_path / "x.tar.gz", "run-2/run.json")["side"] == "b"


# llm-d's benchmark report, version 0.2, as JSON Schema: llm-d-benchmark's workload/report
# benchmark_report_v0_2.py (pydantic, extra="forbid": no field beyond the model's) written out for the
# parts a loadgen report fills; every optional part llm-d has and loadgen leaves out stays allowed.
def _closed(properties: dict, required: tuple = ()) -> dict:
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


_UNITS = ["count", "percent", "fraction", "ms", "s", "MB", "GB", "TB", "MiB", "GiB", "TiB", "Mbit/s", "Gbit/s",
          "Tbit/s", "GiB/s", "MB/s", "GB/s", "TB/s", "ms/token", "s/token", "token/s", "qps", "Watts"]
_NUM = {"type": "number"}
_STAT = _closed({"units": {"enum": _UNITS}, "mean": _NUM, **{k: _NUM for k in (
    "mode", "stddev", "min", "p0p1", "p1", "p5", "p10", "p25", "p50", "p75", "p90", "p95", "p99", "p99p9", "max")}},
    ("units", "mean"))


def _stat(*units: str) -> dict:
    return {"allOf": [_STAT, {"properties": {"units": {"enum": list(units)}}}]}


_SEQ = _closed({"distribution": {"enum": ["fixed", "gaussian", "random", "other"]}, "value": _NUM, "std_dev": _NUM,
                "min": {"type": "integer"}, "max": {"type": "integer"}}, ("distribution", "value"))
LLMD_V0_2 = _closed({
    "version": {"const": "0.2"},
    "run": _closed({"uid": {"type": "string"}, "eid": {"type": "string"}, "cid": {"type": "string"},
                    "user": {"type": "string"},
                    "time": _closed({"start": {"type": "string"}, "end": {"type": "string"},
                                     "duration": {"type": "string", "pattern": r"^P(T[0-9.]+S)$"}})}),
    "scenario": _closed({"stack": {"type": "array"}, "load": _closed({
        "metadata": _closed({"schema_version": {"type": "string"}, "cfg_id": {"type": "string"},
                             "description": {"type": "string"}}),
        "standardized": _closed({"tool": {"type": "string"}, "tool_version": {"type": "string"},
                                 "stage": {"type": "integer"}, "input_seq_len": _SEQ, "output_seq_len": _SEQ,
                                 "prefix": {"type": "object"}, "multi_turn": {"type": "object"},
                                 "rate_qps": _NUM, "concurrency": {"type": "integer"}},
                                ("tool", "tool_version", "input_seq_len")),
        "Native": _closed({"args": {"type": "object"}, "envars": {"type": "object"}, "config": {}}),
    }, ("metadata", "standardized", "Native"))}),
    "results": _closed({"request_performance": _closed({"aggregate": _closed({
        "requests": _closed({"total": {"type": "integer"}, "failures": {"type": "integer"},
                             "incomplete": {"type": "integer"}, "input_length": _stat("count"),
                             "output_length": _stat("count")}, ("total",)),
        "latency": _closed({"time_to_first_token": _stat("ms", "s"),
                            "normalized_time_per_output_token": _stat("ms/token", "s/token"),
                            "time_per_output_token": _stat("ms/token", "s/token"),
                            "inter_token_latency": _stat("ms/token", "s/token"), "request_latency": _stat("ms", "s")}),
        "throughput": _closed({k: _stat("token/s") for k in ("input_token_rate", "output_token_rate",
                                                             "total_token_rate")} | {"requests_rate": _stat("qps")}),
    }), "time_series": {"type": "object"}}), "observability": {"type": "object"}, "profiling": {}}),
}, ("run", "results"))


def test_a_shared_run_carries_each_level_as_an_llm_d_report_that_validates(loadgen, tmp_path):
    import jsonschema

    run = tmp_path / "run"
    with SimThread(slots=2) as sim:
        code, _, err = loadgen("sweep", "--url", sim.url, "--concurrency", "1,2", "--requests", "6", "--n-predict", "8",
                               "--stream", "--output", run)
    assert code == 0, err
    out = tmp_path / "bundle.tar.gz"
    code, _, err = loadgen("share", run, "--output", out)
    assert code == 0, err
    with tarfile.open(out) as tar:
        reports = {m.name.rsplit("/", 1)[1]: json.loads(tar.extractfile(m).read())  # type: ignore[union-attr]
                   for m in tar.getmembers() if "/llm-d/" in m.name}
    levels = json.loads((run / "run.json").read_text())["targets"][0]["levels"]
    assert sorted(reports) == ["smoke-sim-c1.json", "smoke-sim-c2.json"], sorted(reports)
    for level in levels:
        report = reports[f"smoke-sim-c{level['level']}.json"]
        jsonschema.validate(report, LLMD_V0_2)
        agg = report["results"]["request_performance"]["aggregate"]
        assert agg["latency"]["time_to_first_token"]["mean"] == pytest.approx(level["ttft_ms"]["mean"])
        assert agg["latency"]["time_to_first_token"]["p99"] == level["ttft_ms"]["p99"]
        assert agg["throughput"]["output_token_rate"]["mean"] == pytest.approx(level["throughput_tok_s"])
        assert agg["requests"]["total"] == level["requests_ok"] + level["requests_failed"] == 6
        assert report["scenario"]["load"]["standardized"]["concurrency"] == level["level"]
        assert report["scenario"]["load"]["standardized"]["tool"] == "loadgen"
    with pytest.raises(jsonschema.ValidationError):  # the schema is strict: a field llm-d does not know fails
        jsonschema.validate({**reports["smoke-sim-c1.json"], "extra": 1}, LLMD_V0_2)
