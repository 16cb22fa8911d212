"""What a completion request asks for, read the way llama-server's one shared parser reads it.

As in build 11434's server-schema.cpp: unknown fields are ignored and `null` means absent; a field
of the wrong type or outside its hard limits is an HTTP 400 `Field 'name': ...`, as is a missing or
malformed prompt.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass
from enum import Enum
from typing import Any

from .tokenizer import EOS_TOKEN, tokenize

LLAMA_DEFAULT_SEED = 0xFFFF_FFFF  # what seed -1 ("random") reads back as
INT32_MAX = 2**31 - 1
SAMPLERS = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")

# ChatML, the template of the Qwen models the built-in profiles stand for.
CHAT_TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


class Api(Enum):
    """The completion endpoints; one parser, one response shape each."""

    NATIVE = "/completion"
    OAI_COMPLETION = "/v1/completions"
    OAI_CHAT = "/v1/chat/completions"
    OAI_RESPONSES = "/v1/responses"
    ANTHROPIC_MESSAGES = "/v1/messages"


class InvalidRequest(Exception):
    """The request cannot be served: answered with HTTP 400 `invalid_request_error`."""


@dataclass(frozen=True, slots=True)
class CompletionParams:
    prompt_tokens: tuple[int, ...]
    prompt_text: str
    n_predict: int = -1  # -1: until EOS or the context is full
    stream: bool = False
    include_usage: bool = False
    cache_prompt: bool = True
    ignore_eos: bool = False
    id_slot: int = -1
    seed: int = -1
    stop: tuple[str, ...] = ()
    timings_per_token: bool = False
    return_tokens: bool = False
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    n_probs: int = 0
    # A JSON schema, a JSON `response_format` or a grammar was asked: each decode step of this
    # request costs the profile's grammar_ms_per_token more (the answer itself is not constrained).
    constrained: bool = False

    def to_json(self, only_metrics: bool = False) -> dict[str, Any]:
        """`generation_settings`, or with only_metrics a slot's `params`: build 11434's keys and defaults."""
        settings: dict[str, Any] = {
            "seed": self.seed & LLAMA_DEFAULT_SEED,
            "temperature": _f32(self.temperature),
            "dynatemp_range": 0.0,
            "dynatemp_exponent": 1.0,
            "top_k": self.top_k,
            "top_p": _f32(self.top_p),
            "min_p": _f32(self.min_p),
            "top_n_sigma": -1.0,
            "xtc_probability": 0.0,
            "xtc_threshold": _f32(0.1),
            "typical_p": 1.0,
            "repeat_last_n": 64,
            "repeat_penalty": 1.0,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "dry_multiplier": 0.0,
            "dry_base": 1.75,
            "dry_allowed_length": 2,
            "dry_penalty_last_n": -1,
        }
        if not only_metrics:
            settings["dry_sequence_breakers"] = ["\n", ":", "\"", "*"]
        settings.update({
            "mirostat": 0,
            "mirostat_tau": 5.0,
            "mirostat_eta": _f32(0.1),
            "adaptive_target": -1.0,
            "adaptive_decay": _f32(0.9),
        })
        if not only_metrics:
            settings["stop"] = list(self.stop)
        settings.update({
            "max_tokens": self.n_predict,
            "n_predict": self.n_predict,
            "n_keep": 0,
            "n_discard": 0,
            "ignore_eos": self.ignore_eos,
            "stream": self.stream,
        })
        if not only_metrics:
            # ignore_eos works by biasing the end-of-generation tokens to -inf, which JSON writes as null.
            settings["logit_bias"] = [{"bias": None, "token": EOS_TOKEN}] if self.ignore_eos else []
        settings.update({"n_probs": self.n_probs, "min_keep": 0})
        if not only_metrics:
            settings.update({"grammar": "", "grammar_lazy": False, "grammar_triggers": [], "preserved_tokens": []})
        settings.update({
            "chat_format": "Content-only",
            "reasoning_format": "none",
            "reasoning_in_content": False,
            "generation_prompt": "",
            "samplers": list(SAMPLERS),
            "speculative.types": "none",
            "timings_per_token": self.timings_per_token,
            "post_sampling_probs": False,
            "backend_sampling": False,
            "lora": [],
        })
        return settings


def default_params() -> CompletionParams:
    """The server's defaults, as `/props` shows them."""
    return CompletionParams(prompt_tokens=(), prompt_text="")


def parse_request(body: Any, api: Api, n_slots: int, image_tokens: int = 0) -> CompletionParams:
    """A request body -> CompletionParams. Raises InvalidRequest with llama-server's message.
    `image_tokens`: what one image of a chat, Responses or Messages request becomes (0: refused)."""
    if not isinstance(body, dict):
        raise InvalidRequest(f"[json.exception.type_error.304] cannot use at() with {_json_type(body)}")
    if api in (Api.OAI_CHAT, Api.ANTHROPIC_MESSAGES):
        text = chat_prompt(body, image_tokens)
        tokens = tokenize(text)
    elif api is Api.OAI_RESPONSES:
        text = responses_prompt(body, image_tokens)
        tokens = tokenize(text)
    else:
        if "prompt" not in body:
            raise InvalidRequest("[json.exception.out_of_range.403] key 'prompt' not found")
        text, tokens = _prompt(body["prompt"])
    n_cmpl = _number(body, ("n_cmpl", "n"), 1, hard=(1, n_slots))
    if n_cmpl > 1:
        raise InvalidRequest("the simulator answers one completion per request (n_cmpl must be 1)")
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    stream_options = body.get("stream_options")
    return CompletionParams(
        prompt_tokens=tuple(tokens),
        prompt_text=text,
        # n_predict beats max_completion_tokens beats max_tokens (aliases, first found wins).
        n_predict=_number(body, ("n_predict", "max_completion_tokens", "max_tokens", "max_output_tokens"), -1,
                          hard=(-1, INT32_MAX)),
        stream=_flag(body, "stream", False),
        include_usage=_flag(stream_options, "include_usage", False) if isinstance(stream_options, dict) else False,
        cache_prompt=_flag(body, "cache_prompt", True),
        ignore_eos=_flag(body, "ignore_eos", False),
        id_slot=_number(body, ("id_slot",), -1),
        seed=_number(body, ("seed",), -1),
        stop=tuple(w for w in stop if isinstance(w, str) and w) if isinstance(stop, list) else (),
        timings_per_token=_flag(body, "timings_per_token", False),
        return_tokens=_flag(body, "return_tokens", False),
        temperature=max(0.0, _number(body, ("temperature",), 0.8, integer=False)),
        top_k=_number(body, ("top_k",), 40),
        top_p=_number(body, ("top_p",), 0.95, integer=False),
        min_p=_number(body, ("min_p",), 0.05, integer=False),
        n_probs=_number(body, ("n_probs", "logprobs"), 0),
        constrained=_constrained(body),
    )


def _constrained(body: dict[str, Any]) -> bool:
    """Whether the request asks for structured output: `json_schema`, `grammar`, or a JSON `response_format`."""
    response_format = body.get("response_format")
    return (body.get("json_schema") is not None or bool(body.get("grammar"))
            or isinstance(response_format, dict) and response_format.get("type") in ("json_schema", "json_object"))


def chat_prompt(body: dict[str, Any], image_tokens: int = 0) -> str:
    """Render the OpenAI chat messages with ChatML and open the assistant's turn. Offered `tools`
    come first, one JSON line each in a system message, as a tool-calling model's template puts
    them: their cost is the prefill of that text (docs/request-features.md)."""
    if "messages" not in body:
        raise InvalidRequest("'messages' is required")
    messages = body["messages"]
    if not isinstance(messages, list):
        raise InvalidRequest("Expected 'messages' to be an array")
    tools = body.get("tools")
    out = ["<|im_start|>system\nYou may call these tools:\n"
           + "".join(json.dumps(t, separators=(",", ":")) + "\n" for t in tools) + "<|im_end|>\n"] \
        if isinstance(tools, list) and tools else []
    for message in messages:
        if not isinstance(message, dict):
            raise InvalidRequest("Expected each message to be an object")
        role = message.get("role") if isinstance(message.get("role"), str) else ""
        if role != "assistant" and "content" not in message:
            raise InvalidRequest("All non-assistant messages must contain 'content'")
        out.append(f"<|im_start|>{role}\n{_content_text(message.get('content'), image_tokens)}<|im_end|>\n")
    out.append("<|im_start|>assistant\n")
    return "".join(out)


def responses_prompt(body: dict[str, Any], image_tokens: int = 0) -> str:
    """The Responses API's `input` (a string, or a list of messages) rendered like chat."""
    if "input" not in body:
        raise InvalidRequest("'input' is required")
    given = body["input"]
    messages = [{"role": "user", "content": given}] if isinstance(given, str) else given
    return chat_prompt({"messages": messages}, image_tokens)


_TEXT_PARTS = ("text", "input_text")
_IMAGE_PARTS = ("image_url", "input_image", "image")  # chat's, Responses', Messages'
NO_PROJECTOR = "image input is not supported - hint: if this is unexpected, you may need to provide the mmproj"


def _content_text(content: Any, image_tokens: int = 0) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):  # content parts: text, and images as image_tokens tokens each
        out = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
                out.append(part["text"])
            elif kind in _IMAGE_PARTS:
                if not image_tokens:
                    raise InvalidRequest(NO_PROJECTOR)
                out.append(image_text(json.dumps(part, sort_keys=True), image_tokens))
        return "".join(out)
    raise InvalidRequest("Expected 'content' to be a string or an array")


def image_text(data: str, n_tokens: int) -> str:
    """An image as `n_tokens` one-token words drawn from its bytes (two images share tokens only
    when their bytes are the same, as llama-server's image cache keys them)."""
    word = " " + "".join(chr(ord("a") + int(c, 16)) for c in format(zlib.crc32(data.encode()), "08x"))
    return word * n_tokens


def _prompt(prompt: Any) -> tuple[str, list[int]]:
    """A prompt field -> (its text, its tokens). Token ids in a prompt are used as they are."""
    if isinstance(prompt, str):
        return prompt, tokenize(prompt)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            if len(prompt) == 1:
                return prompt[0], tokenize(prompt[0])
            raise InvalidRequest("the simulator serves one prompt per request; send each prompt on its own")
        if all(isinstance(p, (str, int)) and not isinstance(p, bool) for p in prompt):  # mixed strings & tokens
            text = "".join(p for p in prompt if isinstance(p, str))
            tokens: list[int] = []
            for p in prompt:
                tokens.extend(tokenize(p) if isinstance(p, str) else [p])
            return text, tokens
    raise InvalidRequest('"prompt" must be a string, an list of tokens, a list of mixed strings & tokens, '
                         "or a list of prompts")


def _number(data: dict[str, Any], names: tuple[str, ...], default: Any, *, integer: bool = True,
            hard: tuple[int, int] | None = None) -> Any:
    """The first of `names` present and not null, as llama-server's field_num reads it.

    Booleans and floats convert to numbers (3.7 -> 3 for an integer field); any other type, or a
    value outside the hard limits, is a 400 "Field 'name': ..." error.
    """
    for name in names:
        value = data.get(name)
        if value is None:
            continue
        if not isinstance(value, (bool, int, float)):
            raise InvalidRequest(f"Field '{name}': [json.exception.type_error.302] type must be number, "
                                 f"but is {_json_type(value)}")
        number = int(value) if integer else float(value)
        if hard is not None and not hard[0] <= number <= hard[1]:
            raise InvalidRequest(f"Field '{name}': Value must be between {hard[0]} <= value <= {hard[1]}, "
                                 f"but got {number}")
        return number
    return default


def _flag(data: dict[str, Any], name: str, default: bool) -> bool:
    value = data.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidRequest(f"Field '{name}': [json.exception.type_error.302] type must be boolean, "
                             f"but is {_json_type(value)}")
    return value


def _json_type(value: Any) -> str:
    """nlohmann's name for a JSON value's type."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    names: dict[type, str] = {str: "string", list: "array", dict: "object"}
    return names.get(type(value), "discarded")


def _f32(value: float) -> float:
    # llama-server keeps sampling values as float32 and prints them widened: 0.8 -> 0.800000011920929.
    return struct.unpack("f", struct.pack("f", value))[0]
