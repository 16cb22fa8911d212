"""Target labels (run.labels, the --label option): short, distinct, the full model path kept in run.json.

The expected labels below were written down from the rule before the code ran: a path is cut to its
file's stem, a name over 24 characters loses its middle, and only targets that would share a label
get @port (@host:port when the ports are equal too)."""

from __future__ import annotations

import json

import pytest

from loadgen.core.errors import ConfigError
from loadgen.run.config import given_labels
from loadgen.run.labels import MAX_LABEL, LabelSource, model_stem, shorten, target_labels
from servers import SimThread, sim_profile, start_llama_server

SMOL = "/srv/models/SmolLM2-135M-Instruct.Q4_1.gguf"


def src(port: int | str, model: str | None = None, given: str | None = None, host: str = "127.0.0.1",
        scheme: str = "http") -> LabelSource:
    return LabelSource(url=f"{scheme}://{host}:{port}" if port else f"{scheme}://{host}", given=given, model=model)


@pytest.mark.parametrize("sources, expected", [
    # one llama-server without --alias: its model's stem, shortened in the middle
    ([src(18280, SMOL)], ["SmolLM2-135M-Instru…Q4_1"]),
    # two servers of the same model: told apart by port, still within 24 characters
    ([src(18280, SMOL), src(18281, SMOL)], ["SmolLM2-135M…Q4_1@18280", "SmolLM2-135M…Q4_1@18281"]),
    # ... on two machines at the same port: by address
    ([src(8080, SMOL, host="a"), src(8080, SMOL, host="b")], ["SmolLM2-135M…Q4_1@a:8080", "SmolLM2-135M…Q4_1@b:8080"]),
    # aliases given to the servers are kept; different models need no port
    ([src(8080, "smollm2-4slot"), src(8081, "smollm2-1slot")], ["smollm2-4slot", "smollm2-1slot"]),
    ([src(8080, "/m/moe.gguf"), src(8081, "/m/dense.gguf")], ["moe", "dense"]),
    # a server that names no model: its address
    ([src(8080), src(8081)], ["127.0.0.1:8080", "127.0.0.1:8081"]),
    ([src(8080, "  ")], ["127.0.0.1:8080"]),
    ([src(8080, host="very-long-hostname.example.internal")], ["very-long-hostname.example.internal:8080"]),
    # the user's labels win, and a default that meets one is told apart from it
    ([src(8080, SMOL, given="a"), src(8081, SMOL, given="b")], ["a", "b"]),
    ([src(8080, given="fast"), src(8081, "fast")], ["fast", "fast@8081"]),
    ([src(8080, given="a-label-longer-than-twenty-four")], ["a-label-longer-than-twenty-four"]),
    # short names sharing a model
    ([src(8080, "qwen.gguf"), src(8081, "qwen.gguf")], ["qwen@8080", "qwen@8081"]),
    # two names that only shortening made equal
    ([src(8080, "abcdefghijklmnopqrstuvwxyz-one-Q4"), src(8081, "abcdefghijklmnopqrstuvwxyz-two-Q4")],
     ["abcdefghijklmnop…Q4@8080", "abcdefghijklmnop…Q4@8081"]),
    # split GGUF, a Hugging Face id (vLLM), an Ollama tag
    ([src(8080, "/m/Qwen3-30B-A3B-Q4_K_M-00001-of-00002.gguf")], ["Qwen3-30B-A3B-Q4_K_M"]),
    ([src(8000, "meta-llama/Llama-3.1-8B-Instruct")], ["Llama-3.1-8B-Instruct"]),
    ([src(11434, "llama3:8b")], ["llama3:8b"]),
    # nothing tells them apart but their order (a gateway's two paths): numbered
    ([LabelSource("https://gw.example.com/a", model="m"), LabelSource("https://gw.example.com/b", model="m")],
     ["m@gw.example.com", "m@gw.example.com#2"]),
])
def test_default_labels(sources, expected):
    assert target_labels(sources) == expected


def test_every_default_label_fits_and_is_distinct():
    sources = [src(port, f"/models/{name}.gguf") for port in (8080, 18281, 65535)
               for name in ("SmolLM2-135M-Instruct.Q4_1", "Qwen3.6-35B-A3B-UD-Q4_K_XL", "x" * 60)]
    labels = target_labels(sources)
    assert len(set(labels)) == len(labels)
    assert all(len(label) <= MAX_LABEL for label in labels), labels


@pytest.mark.parametrize("model, stem", [
    (SMOL, "SmolLM2-135M-Instruct.Q4_1"), ("C:\\models\\tiny.GGUF", "tiny"), ("tiny", "tiny"),
    ("/models/dir/", "dir"),
])
def test_model_stem(model, stem):
    assert model_stem(model) == stem


@pytest.mark.parametrize("name, limit, short", [
    ("short", 24, "short"), ("x" * 24, 24, "x" * 24), ("x" * 25, 24, "x" * 23 + "…"),
    ("Qwen3.6-35B-A3B-UD-Q4_K_XL", 24, "Qwen3.6-35B-A3B…Q4_K_XL"),
])
def test_shorten(name, limit, short):
    assert shorten(name, limit) == short
    assert len(shorten(name, limit)) <= limit


@pytest.mark.parametrize("values, targets, expected", [
    ((), 3, ()), (("a,b",), 2, ("a", "b")), (("a", "b"), 2, ("a", "b")), ((" a , b ",), 2, ("a", "b")),
    (("a,b", "c"), 3, ("a", "b", "c")),
    (("a,b,c",), 2, "3 labels for 2 targets"), (("a",), 3, "1 label for 3 targets"),
    (("a,b",), 1, "2 labels for 1 target:"), (("a,,b",), 3, "a label is empty"), (("a,a",), 2, "distinct"),
])
def test_label_lists(values, targets, expected):
    if isinstance(expected, tuple):
        assert given_labels(values, targets) == expected
    else:
        with pytest.raises(ConfigError, match=expected):
            given_labels(values, targets)


@pytest.mark.parametrize("labels, targets, message", [
    ("a,b", "8080,8081,8082", "2 labels for 3 targets"),
    ("a,b,c,d", "8080,8081,8082", "4 labels for 3 targets"),
])
def test_a_label_count_that_does_not_match_is_refused_in_one_line(loadgen, labels, targets, message):
    code, out, err = loadgen("sweep", "--ports", targets, "--label", labels, "--concurrency", "1")
    assert code == 2
    assert err.strip().count("\n") == 0 and message in err, err


def unaliased_sim(tmp_path, name: str):
    """A simulator that answers as a llama-server started without --alias: its model's path."""
    profile = sim_profile(tmp_path / f"{name}.toml", name, 1.0, alias=SMOL)
    return SimThread(str(profile), slots=2)


def test_two_simulators_of_one_model_are_told_apart_by_port(tmp_path, loadgen):
    with unaliased_sim(tmp_path, "one") as a, unaliased_sim(tmp_path, "two") as b:
        out = tmp_path / "run"
        code, stdout, stderr = loadgen("sweep", "--url", a.url, "--url", b.url, "--concurrency", "1", "--requests", "2",
                                       "--n-predict", "4", "--warmup", "0", "--output", out)
        ports = (a.port, b.port)
    assert code == 0, stderr
    doc = json.loads((out / "run.json").read_text())
    assert [t["label"] for t in doc["targets"]] == [f"SmolLM2-135M…Q4_1@{p}" for p in ports]
    assert all(t["server"]["props"]["model_alias"] == SMOL for t in doc["targets"])  # the full path is kept
    assert SMOL not in stdout and f"SmolLM2-135M…Q4_1@{ports[0]}" in stdout


def test_three_labels_name_three_targets(tmp_path, loadgen):
    with SimThread(slots=1) as a, SimThread(slots=1) as b, SimThread(slots=1) as c:
        out = tmp_path / "run"
        code, _, stderr = loadgen("sweep", "--url", a.url, "--url", b.url, "--url", c.url, "--label", "a,b,c",
                                  "--concurrency", "1", "--requests", "1", "--n-predict", "2", "--warmup", "0",
                                  "--output", out)
    assert code == 0, stderr
    assert [t["label"] for t in json.loads((out / "run.json").read_text())["targets"]] == ["a", "b", "c"]


@pytest.mark.real
def test_two_real_servers_of_one_model_without_alias(tmp_path, loadgen):
    """What the issue saw: two llama-servers of one model started without --alias report its full path."""
    first = start_llama_server(None, 1, tmp_path)
    try:
        second = start_llama_server(None, 1, tmp_path)
    except BaseException:
        first.stop()
        raise
    try:
        out = tmp_path / "run"
        code, stdout, stderr = loadgen("sweep", "--ports", f"{first.port},{second.port}", "--concurrency", "1",
                                       "--requests", "1", "--n-predict", "4", "--warmup", "0", "--output", out)
    finally:
        first.stop()
        second.stop()
    assert code == 0, stderr
    doc = json.loads((out / "run.json").read_text())
    labels = [t["label"] for t in doc["targets"]]
    assert labels == [f"SmolLM2-135M…Q4_1@{first.port}", f"SmolLM2-135M…Q4_1@{second.port}"]
    paths = [t["server"]["props"]["model_alias"] for t in doc["targets"]]
    assert all(p.endswith("SmolLM2-135M-Instruct.Q4_1.gguf") and len(p) > MAX_LABEL for p in paths)
    assert all(label in stdout for label in labels)
