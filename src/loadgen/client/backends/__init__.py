"""Backends: one module per server API. A backend builds request bodies and reads responses.

It knows nothing about scheduling, connections or time: the engine hands it a salt and gets bytes;
it hands it a status and a body (or, streaming, each event's payload) and gets a `ServerOutcome`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from ...core.images import ImageSet
from ...core.lora_mix import LoraMix
from ...core.model_mix import ModelMix
from ...core.records import ServerOutcome
from ..sse import EventReader
from .conversation import History


@dataclass(frozen=True, slots=True)
class GenerationParams:
    """What every request of a run asks for, whatever the API."""

    prompt: str
    n_predict: int = 96
    temperature: float = 0.7
    ignore_eos: bool = True
    seed: int | None = None
    stream: bool = False
    # Several prompts (a dataset): request number i uses prompts[i % len(prompts)]. Empty: `prompt`.
    prompts: tuple[str, ...] = ()
    # A workload (core/workload.py): body i asks for n_predicts[i] tokens (aligned with
    # `prompt_list`). Empty: every body asks for `n_predict`.
    n_predicts: tuple[int, ...] = ()
    # Text before the salt, aligned with `prompt_list` (a replayed trace's shared blocks, so
    # requests that share them share that prefix on the wire). Empty: the salt comes first.
    prefixes: tuple[str, ...] = ()
    # Let the server reuse cached prompt tokens: only a cache mode (core/cache_mode.py) sets it;
    # otherwise every request's prompt is computed in full.
    cache_prompt: bool = False
    # A reasoning model's effort (chat: `reasoning_effort`; responses: `reasoning.effort`); None: not sent.
    reasoning_effort: str | None = None
    # The APIs that answer without generating (embeddings, rerank): texts per request.
    items: int = 1
    # Structured output and tools (backends/features.py, docs/request-features.md): a JSON schema
    # (llama-server's `json_schema`, chat's `response_format`), a GBNF grammar (`grammar`), tool
    # definitions (chat's `tools`, OpenAI's shape) and `tool_choice` (auto, required, none or a
    # tool's name). Each is serialised once, with the other fields, into every body.
    json_schema: dict[str, Any] | None = None
    grammar: str | None = None
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: str | None = None

    @property
    def checks_answers(self) -> bool:
        """Whether each answer is judged (core/answer_check.py): a schema, a grammar or tools asked."""
        return self.json_schema is not None or self.grammar is not None or bool(self.tools)
    # --lora-mix (core/lora_mix.py): body i carries the LoRA adapter the mix gives request i; None: no `lora` field.
    lora_mix: LoraMix | None = None
    # --models (core/model_mix.py): body i names the router model the mix gives request i; None: the one model.
    model_mix: ModelMix | None = None
    # --images (core/images.py, backends/images.py): the images every chat, Responses or Messages
    # body carries, salted per request; None: text only.
    images: ImageSet | None = None

    @property
    def prompt_list(self) -> tuple[str, ...]:
        return self.prompts or (self.prompt,)


class Backend(Protocol):
    name: str
    method: str
    path: str
    stream: bool

    def build(self, salt: str, index: int = 0) -> bytes:
        """The request body for prompt number `index` (mod the prompt count), salted with `salt`."""
        ...

    def parse(self, status: int, body: bytes) -> ServerOutcome:
        """A whole response body (non-streaming, or any error response) → outcome."""
        ...

    def event_reader(self) -> EventReader:
        """A reader for one streamed response."""
        ...


class AnswerReader(EventReader, Protocol):
    """An event reader that also keeps the answer's text (a conversation re-sends it next turn)."""

    @property
    def answer(self) -> str: ...


class ConversationBackend(Backend, Protocol):
    """A backend that can send a conversation's turn (`loadgen chat`): the same request as its
    `build`, with the history in the prompt (backends/conversation.py)."""

    def build_turn(self, salt: str, history: History, message: str, id_slot: int | None = None) -> bytes:
        """The body of a turn: the earlier exchanges and the new message, salted with `salt`;
        `id_slot` asks llama-server for that slot."""
        ...

    def answer_reader(self) -> AnswerReader:
        """A reader for one streamed turn that keeps the answer's text."""
        ...


class SaltedBodies:
    """Request bodies serialised once per prompt; per request only the salt is spliced in.

    The salt (hex digits and dashes, which JSON needs no escaping for) goes at the very start of
    the prompt text as "[<salt>] ", so no two requests share a prompt prefix the server could reuse.
    `head` is the JSON up to the opening quote of the prompt string; `fields` the rest of the object.
    With `n_predicts` (aligned with `prompts`), body i's `fields[n_predict_key]` is n_predicts[i];
    with `prefixes`, body i's prompt text is prefixes[i] + "[<salt>] " + prompts[i].
    """

    __slots__ = ("_heads", "_tails", "_n")

    def __init__(self, head: bytes, prompts: tuple[str, ...], close: bytes, fields: dict[str, Any],
                 n_predicts: tuple[int, ...] = (), n_predict_key: str = "n_predict", prefixes: tuple[str, ...] = ()):
        encode = msgspec.json.encode
        if n_predicts and len(n_predicts) != len(prompts) or prefixes and len(prefixes) != len(prompts):
            raise ValueError("one n_predict and one prefix per prompt")
        rests = ([encode({**fields, n_predict_key: n})[1:] for n in n_predicts] if n_predicts
                 else [encode(fields)[1:]] * len(prompts))  # '"k":v,...}' without the opening brace
        self._heads = ([head + b'"' + encode(p)[1:-1] + b"[" for p in prefixes] if prefixes
                       else [head + b'"['] * len(prompts))
        self._tails = [b"] " + encode(p)[1:] + close + b"," + rest for p, rest in zip(prompts, rests)]
        self._n = len(self._tails)

    def build(self, salt: str, index: int = 0) -> bytes:
        i = index % self._n
        return self._heads[i] + salt.encode() + self._tails[i]


def generation_fields(params: GenerationParams, length_key: str, **first: Any) -> dict[str, Any]:
    """The JSON fields every API's request carries, in body order: `first` (e.g. the model), the
    length to generate under the API's own key (`n_predict`, `max_tokens`), temperature,
    ignore_eos (llama-server's; vLLM and SGLang read it too, other servers ignore it), no prompt
    cache (it would make every request after the first report prompt_ms ~ 0) unless a cache mode
    sets `params.cache_prompt`, then seed and stream when set."""
    fields: dict[str, Any] = {**first, length_key: params.n_predict, "temperature": params.temperature,
                              "ignore_eos": params.ignore_eos, "cache_prompt": params.cache_prompt}
    if params.seed is not None:
        fields["seed"] = params.seed
    if params.stream:
        fields["stream"] = True
    return fields


def make_backend(api: str, params: GenerationParams, model: str | None = None) -> Backend:
    """The backend of `api` for `params`; with images, a model mix (router) or a LoRA mix, wrapped so
    each body carries its images, names its model or carries its adapter."""
    backend = _api_backend(api, params, model)
    if params.images is not None:
        from .images import ImageBackend

        backend = ImageBackend(backend, api, params.images)
    if params.model_mix is not None:
        from .router import ModelBackend

        backend = ModelBackend(backend, params.model_mix)
    if params.lora_mix is None:
        return backend
    from .lora import LoraBackend

    return LoraBackend(backend, params.lora_mix)


def _api_backend(api: str, params: GenerationParams, model: str | None = None) -> Backend:
    if api == "llamacpp":
        from .llamacpp import LlamaCppBackend

        return LlamaCppBackend(params)
    if api in ("completions", "chat"):
        from .openai import OpenAIBackend

        return OpenAIBackend(params, chat=api == "chat", model=model)
    if api == "responses":
        from .responses import ResponsesBackend

        return ResponsesBackend(params, model=model)
    if api == "messages":
        from .messages import MessagesBackend

        return MessagesBackend(params, model=model)
    if api in ANSWER_APIS:
        from .embeddings import AnswerBackend

        return AnswerBackend(params, rerank=api == "rerank", model=model)
    raise ValueError(f"unknown API {api!r}")


def conversation_backend(api: str, params: GenerationParams, model: str | None = None) -> ConversationBackend:
    """The backend of `api` for conversation turns; ValueError for an API without one."""
    if api not in CONVERSATION_APIS:
        raise ValueError(f"no conversation turns over API {api!r}")
    return _api_backend(api, params, model)  # type: ignore[return-value]  # both speak turns


# The APIs whose backends send a conversation's turns (`build_turn`, `answer_reader`).
CONVERSATION_APIS = ("llamacpp", "chat")
API_NAMES = ("llamacpp", "completions", "chat", "responses", "messages", "embeddings", "rerank")
# The APIs that answer without generating or streaming (backends/embeddings.py): `--items` texts a
# request, output tokens 0, and their answers checked under load (run/answer_check.py).
ANSWER_APIS = ("embeddings", "rerank")
# The APIs with a field for a reasoning effort, and the values they take.
REASONING_EFFORT_APIS = ("chat", "responses")
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high")
# The APIs that take a JSON schema or a grammar (llama-server: /completion, /v1/completions, chat),
# and tools (chat).
STRUCTURED_APIS = ("llamacpp", "completions", "chat")
TOOLS_APIS = ("chat",)
IMAGE_APIS = ("chat", "responses", "messages")  # the APIs whose messages carry images (backends/images.py)
# The APIs whose requests carry a model name (from --model or the server's /v1/models).
OPENAI_APIS = ("completions", "chat", "responses", "messages", "embeddings", "rerank")
# The APIs whose prompt goes through the server's chat template.
CHAT_TEMPLATE_APIS = ("chat", "responses", "messages")
