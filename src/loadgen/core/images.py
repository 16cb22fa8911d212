"""Images in every request (`--images K:WxH`, `--images-from FILES`): made once, salted per request.

Every image goes on the wire as a BMP (24-bit, uncompressed; llama-server decodes it like any other
format), base64 in a data URI. BMP is chosen for the salt: its first pixel's bytes sit at a fixed
offset (54) that is a multiple of 3, so they are base64 characters 72-79 of the encoded file, and a
request's salted copy is the one encoded text with those 8 characters replaced: no image is
re-encoded per request. The salt is 6 bytes (the first two pixels) drawn from the request's own text
salt and the image's place in the request, so every image of every request differs from every other
and the server's image cache (llama-server keys an image by a hash of its pixels) never answers
from an earlier request. `cached` (`--image-cache`) sends the images as made, unsalted, so a
repeated image can be answered from the cache on purpose (the run then sends `cache_prompt: true`).

Generated images are a deterministic colour pattern of W×H; files are decoded with pillow (a file
that is not an image is refused in one line) and sent as BMPs of their own pixels. Request `seq`
carries images `seq*K ... seq*K+K-1` of the set, modulo its size.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ConfigError

MIME = "image/bmp"
_SALT_AT = 72  # base64 characters of BMP byte 54 (the first pixel): 54 / 3 * 4
_SALT_LEN = 8  # base64 characters of 6 bytes
_SPEC = re.compile(r"^(\d+):(\d+)x(\d+)$")
MAX_SIDE = 8192


@dataclass(frozen=True, slots=True)
class ImageSet:
    """The images a run's requests carry: `per_request` of them each, drawn in turn from `images`
    (each a BMP's base64 text); `spec` says where they came from (run.json's config)."""

    images: tuple[str, ...]
    per_request: int
    spec: str
    cached: bool = False

    def for_request(self, salt: str, seq: int) -> list[str]:
        """The base64 texts of request `seq`'s images, salted from `salt` unless `cached`."""
        n = len(self.images)
        chosen = [self.images[(seq * self.per_request + j) % n] for j in range(self.per_request)]
        if self.cached:
            return chosen
        return [salted(text, f"{salt}/{j}") for j, text in enumerate(chosen)]

    def pieces(self, salt: str, seq: int) -> list[list[bytes | memoryview]]:
        """Request `seq`'s images as the bytes-like pieces of their base64 texts (for `bytes.join`):
        the image's own bytes viewed around the salt's 8 characters, nothing copied."""
        n = len(self.images)
        out: list[list[bytes | memoryview]] = []
        for j in range(self.per_request):
            raw = _encoded(self.images[(seq * self.per_request + j) % n])
            if self.cached:
                out.append([raw])
            else:
                view = memoryview(raw)
                out.append([view[:_SALT_AT], _salt(f"{salt}/{j}"), view[_SALT_AT + _SALT_LEN:]])
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"images": self.spec, "per_request": self.per_request, "salted": not self.cached}


def salted(b64: str, key: str) -> str:
    """A BMP's base64 text with its first two pixels set from `key` (6 bytes of its hash)."""
    return b64[:_SALT_AT] + _salt(key).decode() + b64[_SALT_AT + _SALT_LEN:]


def _salt(key: str) -> bytes:
    return base64.b64encode(hashlib.blake2b(key.encode(), digest_size=6).digest())


@functools.lru_cache(maxsize=64)
def _encoded(b64: str) -> bytes:
    return b64.encode()


def parse_spec(text: str) -> tuple[int, int, int]:
    """--images K:WxH -> (K, W, H); K ≥ 1, each side 2..8192 (two pixels hold the salt)."""
    m = _SPEC.match(text.strip())
    if m is None:
        raise ConfigError(f"--images {text!r}: give K:WxH, e.g. 1:640x480 (K images of W×H pixels a request), "
                          "or K with --images-from")
    k, w, h = (int(g) for g in m.groups())
    if k < 1 or not (2 <= w <= MAX_SIDE and 1 <= h <= MAX_SIDE):
        raise ConfigError(f"--images {text!r}: K at least 1, width 2-{MAX_SIDE} and height 1-{MAX_SIDE} pixels")
    return k, w, h


def generated(spec: str, cached: bool = False) -> ImageSet:
    """--images K:WxH: K generated W×H images a request (a deterministic pattern, one image made)."""
    import numpy as np

    k, w, h = parse_spec(spec)
    y, x = np.mgrid[0:h, 0:w]
    pixels = np.stack([(x * 255 // max(w - 1, 1)), (y * 255 // max(h - 1, 1)), ((x + y) * 7) % 256], axis=-1)
    return ImageSet((_bmp_b64(pixels.astype(np.uint8)),), k, spec, cached)


def from_files(paths: list[str], per_request: int, cached: bool = False) -> ImageSet:
    """--images-from: each file decoded with pillow (refused in one line when it is not an image)."""
    import numpy as np
    from PIL import Image, UnidentifiedImageError

    images = []
    for path in paths:
        try:
            with Image.open(Path(path)) as im:
                pixels = np.asarray(im.convert("RGB"))
        except (UnidentifiedImageError, OSError, ValueError) as exc:
            raise ConfigError(f"--images-from {path}: not an image pillow can read ({exc})") from None
        if pixels.shape[1] < 2:
            raise ConfigError(f"--images-from {path}: at least 2 pixels wide (two pixels hold the salt)")
        images.append(_bmp_b64(pixels))
    if not images:
        raise ConfigError("--images-from: no files given")
    return ImageSet(tuple(images), per_request, f"{per_request} from {len(images)} files", cached)


def _bmp_b64(pixels: Any) -> str:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, "BMP")
    data = out.getvalue()
    assert data[10:14] == (54).to_bytes(4, "little"), "pillow's BMP pixel data starts at byte 54"
    return base64.b64encode(data).decode()
