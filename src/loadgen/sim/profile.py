"""A simulated model's speed and identity, read once from TOML.

The timing model (see scheduler.py for how it is driven):

    prefill:  n prompt tokens cost n * 1000 / prefill_tok_s ms
    decode:   one step that advances b busy slots by one token each costs
              step_ms(b) = step_ms * (1 + alpha * (b - 1)) ms
    so the aggregate decode rate at b busy slots is b * 1000 / step_ms(b) tok/s;
              a step costs grammar_ms_per_token more for each of those slots whose request
              asks for structured output (a schema or a grammar; 0 by default)
    images:   each image in a chat, Responses or Messages request is image_tokens prompt tokens
              (0 by default: no projector), prefilled like the text

Built-in profiles live in `loadgen/profiles/*.toml`; `load_profile` takes a built-in name or a path.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from .faults import FaultConfig


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    model_alias: str
    prefill_tok_s: float  # prompt tokens per second
    step_ms: float  # one decode step with a single busy slot
    alpha: float  # slowdown per extra busy slot in a decode step
    n_ctx: int  # context per slot
    eos_probability: float  # chance per generated token of EOS when ignore_eos is off
    model_path: str = ""
    n_batch: int = 2048  # prompt tokens that fit in one decode call (llama-server -b)
    n_params: int = 0
    size_bytes: int = 0
    n_ctx_train: int = 0
    # Structured output: what a decode step costs more for each generating slot whose request is
    # constrained (a JSON schema, `response_format`, or a grammar): sampling under a grammar is CPU
    # work per token and sequence (docs/request-features.md). 0: free.
    grammar_ms_per_token: float = 0.0
    faults: FaultConfig = field(default_factory=FaultConfig)
    # Images (docs/request-features.md): the prompt tokens one image becomes, as a vision projector's
    # fixed image size gives; their cost is their prefill. 0: no projector (/props says vision false
    # and a request with an image is refused, as llama-server without --mmproj refuses it).
    image_tokens: int = 0
    # Tokens per second of an embedding or rerank text, in one slot (sim/embeddings.py); 0: prefill_tok_s.
    embed_tok_s: float = 0.0

    def embed_ms(self, n_tokens: int) -> float:
        """n_tokens * 1000 / embed_tok_s (prefill_tok_s when 0): one text's embedding or rerank."""
        return n_tokens * 1000.0 / (self.embed_tok_s or self.prefill_tok_s)

    def decode_step_ms(self, busy: int) -> float:
        """step_ms(b) = step_ms * (1 + alpha * (b - 1)), for b >= 1 slots decoding in the step."""
        return self.step_ms * (1.0 + self.alpha * (busy - 1))

    def prefill_ms(self, n_tokens: int) -> float:
        """n_tokens * 1000 / prefill_tok_s."""
        return n_tokens * 1000.0 / self.prefill_tok_s


def _profiles_dir() -> Traversable:
    # `profiles/*.toml` is package data of `loadgen` (pyproject.toml), found the same way when installed.
    return resources.files("loadgen").joinpath("profiles")


def builtin_profiles() -> tuple[str, ...]:
    return tuple(sorted(p.name.removesuffix(".toml") for p in _profiles_dir().iterdir() if p.name.endswith(".toml")))


def load_profile(name_or_path: str) -> Profile:
    """A built-in profile by name, or a profile from a .toml file. ValueError (one line) otherwise."""
    if name_or_path in builtin_profiles():
        text = _profiles_dir().joinpath(f"{name_or_path}.toml").read_text("utf-8")
        return parse_profile(text, source=name_or_path)
    path = Path(name_or_path)
    if not path.is_file():
        raise ValueError(f"unknown profile '{name_or_path}': give one of {', '.join(builtin_profiles())} "
                         "or the path of a .toml file")
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"profile {path}: cannot read it ({exc})") from None
    return parse_profile(text, source=str(path))


_REQUIRED = ("name", "model_alias", "prefill_tok_s", "step_ms", "alpha", "n_ctx", "eos_probability")
_TYPES: dict[str, tuple[type, ...]] = {
    "name": (str,), "model_alias": (str,), "model_path": (str,),
    "prefill_tok_s": (int, float), "step_ms": (int, float), "alpha": (int, float), "eos_probability": (int, float),
    "grammar_ms_per_token": (int, float), "n_ctx": (int,), "n_batch": (int,), "n_params": (int,),
    "size_bytes": (int,), "n_ctx_train": (int,), "image_tokens": (int,),
    "faults": (list,), "embed_tok_s": (int, float),
}


def parse_profile(text: str, source: str = "<profile>") -> Profile:
    """Validate a profile's TOML text once, here, so the simulator never sees a bad value."""
    try:
        data: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"profile {source}: not valid TOML ({exc})") from None
    known = {f.name for f in fields(Profile)}
    for key, value in data.items():
        if key not in known:
            raise ValueError(f"profile {source}: unknown field '{key}'")
        if not isinstance(value, _TYPES[key]) or isinstance(value, bool):
            raise ValueError(f"profile {source}: field '{key}' has the wrong type")
    missing = [key for key in _REQUIRED if key not in data]
    if missing:
        raise ValueError(f"profile {source}: missing field(s) {', '.join(missing)}")
    for key in ("prefill_tok_s", "step_ms", "n_ctx", "n_batch"):
        if key in data and data[key] <= 0:
            raise ValueError(f"profile {source}: '{key}' must be positive")
    for key in ("alpha", "grammar_ms_per_token", "image_tokens"):
        if data.get(key, 0) < 0:
            raise ValueError(f"profile {source}: '{key}' must not be negative")
    if not 0 <= data["eos_probability"] <= 1:
        raise ValueError(f"profile {source}: 'eos_probability' must be in [0, 1]")
    if data.get("embed_tok_s", 0) < 0:
        raise ValueError(f"profile {source}: 'embed_tok_s' must not be negative")
    for key in ("prefill_tok_s", "step_ms", "alpha", "eos_probability", "embed_tok_s"):
        if key not in data:
            continue
        data[key] = float(data[key])
    data["grammar_ms_per_token"] = float(data.get("grammar_ms_per_token", 0.0))
    try:
        data["faults"] = FaultConfig.parse(str(spec) for spec in data.get("faults", []))
    except ValueError as exc:
        raise ValueError(f"profile {source}: {exc}") from None
    data.setdefault("model_path", f"/models/{data['model_alias']}.gguf")
    return Profile(**data)
