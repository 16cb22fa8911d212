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
