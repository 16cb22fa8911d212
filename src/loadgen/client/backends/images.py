"""A backend whose requests each carry images (`--images`, core/images.py), around the chat,
Responses or Messages backend.

The wrapped backend's body is read back (its text only: a few hundred bytes), its user text turned
into a list of parts, the images first and the text after (so `--image-cache` can share the prefix
up to the images' end), and written again with each image's salted base64 spliced in. Each API's
part shapes (checked against llama-server build 11434):

    chat       `messages[-1].content`: `{"type": "image_url", "image_url": {"url": "data:image/bmp;base64,..."}}`
               then `{"type": "text", "text": ...}`
    responses  `input` becomes `[{"role": "user", "content": [{"type": "input_image", "image_url":
               "data:..."}, ..., {"type": "input_text", "text": ...}]}]`
    messages   `messages[-1].content`: `{"type": "image", "source": {"type": "base64", "media_type":
               "image/bmp", "data": ...}}` then `{"type": "text", "text": ...}`

With `--image-cache` the body also asks `cache_prompt: true`, so the server may reuse the images.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ...core.images import MIME, ImageSet
from . import IMAGE_APIS
from .wrapped import Wrapped

_MARK = "\x00loadgen-image-{}\x00"


def image_part(api: str, mark: str) -> dict[str, Any]:
    """One image's part under `api`'s shape, its base64 text `mark` (spliced in later)."""
    if api == "messages":
        return {"type": "image", "source": {"type": "base64", "media_type": MIME, "data": mark}}
    url = f"data:{MIME};base64,{mark}"
    if api == "responses":
        return {"type": "input_image", "image_url": url}
    return {"type": "image_url", "image_url": {"url": url}}


def with_parts(api: str, body: dict[str, Any], n_images: int, cache: bool) -> dict[str, Any]:
    """`body` (the wrapped backend's, decoded) with its user text made image parts then the text."""
    images = [image_part(api, _MARK.format(j)) for j in range(n_images)]
    if api == "responses":
        text = body["input"]
        body["input"] = [{"role": "user", "content": [*images, {"type": "input_text", "text": text}]}]
    else:
        message = body["messages"][-1]
        message["content"] = [*images, {"type": "text", "text": message["content"]}]
    if cache:
        body["cache_prompt"] = True
    return body


class ImageBackend:
    """`inner`'s requests, each with its images; the same API otherwise."""

    def __init__(self, inner: Wrapped, api: str, images: ImageSet):
        if api not in IMAGE_APIS:
            raise ValueError(f"images go on the {', '.join(IMAGE_APIS)} APIs, not {api}")
        self.inner, self.api, self.images = inner, api, images
        self.name, self.method, self.path, self.stream = inner.name, inner.method, inner.path, inner.stream
        self.parse, self.event_reader = inner.parse, inner.event_reader
        self._marks = [msgspec.json.encode(_MARK.format(j))[1:-1] for j in range(images.per_request)]

    def build(self, salt: str, index: int = 0) -> bytes:
        body = with_parts(self.api, msgspec.json.decode(self.inner.build(salt, index)), self.images.per_request,
                          self.images.cached)
        rest = msgspec.json.encode(body)
        parts: list[Any] = []
        for j, image in enumerate(self.images.pieces(salt, index)):  # spliced in, nothing re-encoded
            head, rest = rest.split(self._marks[j], 1)
            parts += [head, *image]
        parts.append(rest)
        return b"".join(parts)
