"""--images without a server: the image bytes salted per request, each API's part shapes, and the
refusals before the first level (core/images.py, client/backends/images.py, cli/request_features.py,
run/images.py; docs/request-features.md)."""

from __future__ import annotations

import base64
import http.server
import io
import json

import numpy as np
import pytest
from PIL import Image

from loadgen.cli.request_features import image_features
from loadgen.client.backends import GenerationParams, make_backend
from loadgen.core.errors import EXIT_FAILED, EXIT_USAGE, ConfigError
from loadgen.core.images import generated, parse_spec
from loadgen.core.records import ServerOutcome, Usage
from loadgen.results.reader import load_records, load_run_dict
from loadgen.run.images import image_figures, projector_refusal
from servers import SimThread, run_cli, serve_handler


def _pixels(b64: str):
    with Image.open(io.BytesIO(base64.b64decode(b64))) as im:
        return im.size, np.asarray(im.convert("RGB")).reshape(-1, 3).tolist()


@pytest.mark.parametrize("text, expected", [
    ("1:640x480", (1, 640, 480)),
    ("3:64x64", (3, 64, 64)),
    (" 2:2x1 ", (2, 2, 1)),
    ("0:64x64", None),   # no images
    ("1:1x64", None),    # one pixel wide: no room for the salt
    ("1:64", None),
    ("64x64", None),
    ("1:9000x10", None),
])
def test_the_spec_is_k_images_of_w_by_h(text, expected):
    if expected is None:
        with pytest.raises(ConfigError):
            parse_spec(text)
    else:
        assert parse_spec(text) == expected


def test_every_request_and_every_image_in_it_gets_its_own_pixels():
    images = generated("2:40x30")
    a0, a1 = images.for_request("0000000000000001", 0)
    b0, _ = images.for_request("0000000000000002", 1)
    size, base = _pixels(images.images[0])
    decoded = [_pixels(x) for x in (a0, a1, b0)]
    assert all(s == size == (40, 30) for s, _ in decoded)  # each still a whole, decodable image
    assert len({a0, a1, b0}) == 3
    for _, pixels in decoded:  # only the salt's two pixels differ from the image as made
        changed = [i for i, (p, q) in enumerate(zip(pixels, base, strict=True)) if p != q]
        assert changed and set(changed) <= {40 * 29, 40 * 29 + 1}  # BMP's first stored pixels: the bottom row's
    assert images.for_request("0000000000000001", 0) == [a0, a1]  # a salt gives the same bytes again


def test_the_cache_mode_sends_the_images_as_made():
    images = generated("1:16x16", cached=True)
    assert images.for_request("1", 0) == images.for_request("2", 5) == [images.images[0]]
    assert images.to_dict() == {"images": "1:16x16", "per_request": 1, "salted": False}


def _body(api, cache=False):
    params = GenerationParams(prompt="Describe it.", n_predict=4, images=generated("2:8x8", cached=cache))
    return json.loads(make_backend(api, params, "m").build("0123456789012345", 0))


def test_each_api_carries_the_images_first_then_the_salted_text():
    chat = _body("chat")["messages"][-1]["content"]
    assert [p["type"] for p in chat] == ["image_url", "image_url", "text"]
    assert chat[0]["image_url"]["url"].startswith("data:image/bmp;base64,Qk")  # "BM"
    assert chat[2]["text"].startswith("[0123456789012345]") and "Describe it." in chat[2]["text"]
    responses = _body("responses")["input"]
    assert [p["type"] for p in responses[0]["content"]] == ["input_image", "input_image", "input_text"]
    assert responses[0]["content"][0]["image_url"].startswith("data:image/bmp;base64,")
    messages = _body("messages")["messages"][-1]["content"]
    assert [p["type"] for p in messages] == ["image", "image", "text"]
    assert messages[0]["source"]["media_type"] == "image/bmp" and messages[0]["source"]["type"] == "base64"
    assert _body("chat")["cache_prompt"] is False and _body("chat", cache=True)["cache_prompt"] is True
    sent = [p["source"]["data"] for p in messages[:2]]  # the bytes spliced in are the salted images
    assert sent == generated("2:8x8").for_request("0123456789012345", 0) != list(generated("2:8x8").images) * 2
    cached = [p["image_url"]["url"].split(",", 1)[1] for p in _body("chat", cache=True)["messages"][-1]["content"][:2]]
    assert cached == list(generated("2:8x8").images) * 2


def test_an_api_without_images_a_file_that_is_no_image_and_a_cache_without_images_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="the llamacpp API carries no images"):
        image_features("1:64x64", api="llamacpp")
    with pytest.raises(ConfigError, match="the completions API carries no images"):
        image_features("1:64x64", api="completions")
    text = tmp_path / "notes.png"
    text.write_text("not a picture")
    with pytest.raises(ConfigError, match=r"--images-from .*notes.png: not an image pillow can read") as err:
        image_features(None, (str(tmp_path),), api="chat")
    assert err.value.exit_code == EXIT_USAGE
    with pytest.raises(ConfigError, match="--image-cache needs --images"):
        image_features(None, (), True, api="chat")
    with pytest.raises(ConfigError, match="no such file"):
        image_features(None, (str(tmp_path / "missing"),), api="chat")
    assert image_features(None, (), api="llamacpp") is None


def test_files_go_as_their_own_pixels(tmp_path):
    Image.new("RGB", (12, 10), (200, 10, 30)).save(tmp_path / "a.png")
    Image.new("RGB", (5, 7), (1, 2, 3)).save(tmp_path / "b.jpg")
    images = image_features("2", (str(tmp_path),), api="messages")
    assert images.per_request == 2 and [_pixels(x)[0] for x in images.images] == [(12, 10), (5, 7)]
    assert images.spec == "2 from 2 files"


@pytest.mark.parametrize("modalities, refused", [
    ({"vision": False, "video": False, "audio": False}, True),  # llama-server without --mmproj
    ({"vision": True, "video": True, "audio": False}, False),
    ({"audio": True}, False),                                   # says nothing of vision: asked directly
    (None, False),                                              # not llama-server
])
def test_a_server_whose_props_say_no_vision_is_refused_exit_1(modalities, refused):
    refusal = projector_refusal(modalities, "srv")
    assert (refusal is not None) == refused
    if refusal is not None:
        assert refusal.exit_code == EXIT_FAILED and "--mmproj" in str(refusal)


def test_image_tokens_are_the_whole_prompts_difference_cached_tokens_included():
    text = ServerOutcome(prompt_n=58, prompt_ms=100.0, cache_n=0)
    first = ServerOutcome(prompt_n=50, prompt_ms=300.0, cache_n=24)   # a cached template head
    later = ServerOutcome(prompt_n=None, cache_n=None, usage=Usage(prompt_tokens=74))
    figures = image_figures(text, first, later)
    assert figures["image_tokens"] == 16 and figures["prompt_n"] == 74 and figures["later_prompt_n"] == 74
    assert figures["prompt_ms_first"] == 300.0 and figures["prompt_ms_later"] is None


def test_the_simulator_says_no_vision_and_is_refused_before_the_first_level(tmp_path):
    with SimThread() as sim:
        code, _, err = run_cli("sweep", "--url", sim.url, "--api", "chat", "--images", "1:32x32", "--concurrency", "1",
                               "--requests", "1", "--output", tmp_path / "run")
    assert code == EXIT_FAILED, err
    assert "takes no images (its /props says modalities.vision false)" in err


class _NoImages(http.server.BaseHTTPRequestHandler):
    """A server that says nothing of modalities and answers a request with images with an error."""

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.send_response(404 if self.path == "/props" else 200)
        self.end_headers()
        self.wfile.write(b"{}")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        has_images = isinstance(body["messages"][-1]["content"], list)
        self.send_response(500 if has_images else 200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        answer = ({"error": {"code": 500, "message": "image input is not supported by this server"}} if has_images
                  else {"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": 9, "completion_tokens": 1}})
        self.wfile.write(json.dumps(answer).encode())


def test_a_server_that_refuses_an_image_is_named_from_its_answer(tmp_path):
    with serve_handler(_NoImages) as url:
        code, _, err = run_cli("sweep", "--url", url, "--api", "chat", "--images", "1:32x32", "--concurrency", "1",
                               "--requests", "1", "--output", tmp_path / "run")
    assert code == EXIT_FAILED, err
    assert "refused a request with images: image input is not supported by this server" in err


def test_the_simulator_learns_an_images_cost_from_its_profile(tmp_path):
    profile = tmp_path / "vision.toml"
    profile.write_text('name = "vision"\nmodel_alias = "vision-sim"\nprefill_tok_s = 50000.0\nstep_ms = 1.0\n'
                       'alpha = 0.25\nn_ctx = 4096\neos_probability = 0.02\nimage_tokens = 16\n')
    for api in ("chat", "responses", "messages"):
        with SimThread(str(profile)) as sim:
            code, _, err = run_cli("sweep", "--url", sim.url, "--api", api, "--images", "2:32x32", "--concurrency", "2",
                                   "--requests", "4", "--n-predict", "4", "--output", tmp_path / api)
        assert code == 0, err
        images = load_run_dict(tmp_path / api)["targets"][0]["images"]
        assert images["image_tokens"] == 32, (api, images)
        records = load_records(tmp_path / api)
        assert {(r.prompt_n or r.usage.prompt_tokens) + (r.cache_n or 0) - images["text_prompt_n"]
                for r in records} == {32}, api
