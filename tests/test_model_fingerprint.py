"""results/model_fingerprint.py: a model file's content fingerprint, computed once per file and cached."""

from __future__ import annotations

import json
import os

from loadgen.results.model_fingerprint import HEAD, TAIL, fingerprint_bytes, model_fingerprint


def test_files_of_one_size_with_other_contents_differ_and_a_file_is_read_once(tmp_path):
    cache = tmp_path / "cache.json"
    a, b = tmp_path / "a" / "model.gguf", tmp_path / "b" / "model.gguf"
    for path, last in ((a, b"x"), (b, b"y")):
        path.parent.mkdir()
        path.write_bytes(b"GGUF" + bytes(HEAD + TAIL) + last)  # the same size, the last byte differs
    fa, fb = model_fingerprint(a, cache), model_fingerprint(b, cache)
    assert fa and fb and fa != fb
    assert fa == fingerprint_bytes(a.stat().st_size, a.read_bytes()[:HEAD], a.read_bytes()[-TAIL:])
    # cached by path, size and time: contents changed under the same size and time still read from the cache
    assert sorted(json.loads(cache.read_text()).values()) == sorted([fa, fb])
    stat = a.stat()
    a.write_bytes(b"FFUG" + a.read_bytes()[4:])
    os.utime(a, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert model_fingerprint(a, cache) == fa
    a.touch()  # a new time: read again
    assert model_fingerprint(a, cache) not in (fa, None)


def test_a_file_this_machine_cannot_read_has_none(tmp_path):
    assert model_fingerprint(tmp_path / "elsewhere.gguf", tmp_path / "cache.json") is None
    assert not (tmp_path / "cache.json").exists()


def test_a_damaged_cache_is_rebuilt(tmp_path):
    cache = tmp_path / "cache.json"
    cache.write_text("{not json")
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" * 10)
    assert model_fingerprint(model, cache) == fingerprint_bytes(40, b"GGUF" * 10, b"GGUF" * 10)
    assert len(json.loads(cache.read_text())) == 1
