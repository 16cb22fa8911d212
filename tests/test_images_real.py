"""--images against the real llama-server test bed (build 11434) started with a random-weight
vision projector the test writes (tests/mmproj_gguf.py: 64-pixel images, 16 tokens each): the
image tokens a request carries equal the server's own count (and Σ tokens a level its counters), a salted image is never answered from
the cache while --image-cache lets it be, and a server without a projector is refused before the
first level (docs/request-features.md)."""

from __future__ import annotations

import pytest

from loadgen.core.errors import EXIT_FAILED
from loadgen.results.reader import load_records, load_run_dict
from mmproj_gguf import image_tokens, write_mmproj
from servers import start_llama_server, sweep
from servers import testbed_paths as bed_paths

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def vision_server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mmproj")
    _, model = bed_paths()
    projector = write_mmproj(folder / "mmproj.gguf", model)
    server = start_llama_server(None, 2, folder, extra=("--mmproj", str(projector)))
    yield server
    server.stop()


def _run(url, out, *args):
    proc = sweep("--url", url, "--api", "chat", "--concurrency", "2", "--requests", "4", "--n-predict", "4",
                 "--warmup", "0", "--output", str(out), *args)
    assert proc.returncode == 0, proc.stderr
    target = load_run_dict(out)["targets"][0]
    records = load_records(out)
    level, = target["levels"]  # Σ tokens of the level = the server's own counters, image tokens included
    delta = level["server_metrics_delta"]
    assert delta["llamacpp:prompt_tokens_total"] == sum(r.prompt_n for r in records), delta
    assert delta["llamacpp:tokens_predicted_total"] == level["output_tokens"] == sum(r.output_tokens for r in records)
    return target["images"], records


def test_image_tokens_equal_the_servers_count_and_a_salted_image_is_never_cached(vision_server, tmp_path):
    images, records = _run(vision_server.url, tmp_path / "run", "--images", "2:64x64")
    assert images["image_tokens"] == 2 * image_tokens() == 32, images  # the projector's 16 a 64-pixel image
    assert images["prompt_n"] == images["later_prompt_n"] == images["text_prompt_n"] + 32
    assert len(records) == 4 and all(r.ok for r in records), [r.error_message for r in records]
    # each request's prompt, as the server counted it, is the text's and the images' tokens
    assert {r.prompt_n + (r.cache_n or 0) - images["text_prompt_n"] for r in records} == {32}
    assert [r.cache_n for r in records] == [0] * 4  # nothing reused: every image and text is its own


def test_the_cache_mode_lets_the_server_reuse_a_repeated_image(vision_server, tmp_path):
    images, records = _run(vision_server.url, tmp_path / "run", "--images", "1:64x64", "--image-cache",
                           "--concurrency", "1", "--requests", "3")  # the last of an option wins
    assert images["image_tokens"] == 16
    assert all(r.ok for r in records)
    # the template's head and the image come before the salted text: read from the cache
    assert all((r.cache_n or 0) >= 16 + 1 for r in records), [r.cache_n for r in records]
    assert {r.prompt_n + r.cache_n - images["text_prompt_n"] for r in records} == {16}


def test_a_server_without_a_projector_is_refused_before_the_first_level(tmp_path):
    server = start_llama_server(None, 1, tmp_path)
    try:
        proc = sweep("--url", server.url, "--api", "chat", "--images", "1:64x64", "--concurrency", "1",
                     "--requests", "1", "--output", str(tmp_path / "run"))
    finally:
        server.stop()
    assert proc.returncode == EXIT_FAILED, proc.stderr
    line, = [x for x in proc.stderr.splitlines() if "error" in x]
    assert "takes no images" in line and "--mmproj" in line
