"""Every JSON body the simulator sends, in llama-server's shapes and key order.

Completion endpoints share one result and differ only in shape; a `Dialect` per endpoint turns
scheduler events into the objects of that endpoint:
    partial(event)      -> the objects one streamed token produces (maybe none)
    final_stream(res)   -> the objects that end a stream (before `[DONE]`, if the dialect has it)
    final(res)          -> the body of a non-streaming answer
"""

from __future__ import annotations

import json
import time
from typing import Any

from .params import CHAT_TEMPLATE, Api, CompletionParams, default_params
from .profile import Profile
from .scheduler import Slot
from .task import CompletionResult, Task, TokenEvent
from .tokenizer import EOS_TEXT, N_VOCAB

BUILD_INFO = "b11434-sim"
MODEL_FTYPE = "Q4_K - Medium"
CHAT_TEMPLATE_CAPS = {
    "supports_object_arguments": False, "supports_parallel_tool_calls": False, "supports_preserve_reasoning": False,
    "supports_reasoning_effort": False, "supports_string_content": True, "supports_system_role": True,
    "supports_tool_calls": False, "supports_tools": False, "supports_typed_content": False,
}
N_EMBD = 2048


def dumps(obj: Any) -> bytes:
    """Compact UTF-8 JSON like nlohmann's dump(); never NaN/Infinity (the timings stay finite)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def sse(obj: Any) -> bytes:
    """One event. An object with a string `type` (the Responses and Messages APIs' events) is sent
    as a named event, `event: <type>` before its data line, as llama-server does."""
    kind = obj.get("type") if isinstance(obj, dict) else None
    if isinstance(kind, str):
        return b"event: " + kind.encode() + b"\ndata: " + dumps(obj) + b"\n\n"
    return b"data: " + dumps(obj) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def error(code: int, message: str, type_: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "type": type_, **extra}}


# The HTTP layer writes these two with their keys in another order.
LOADING = {"error": {"message": "Loading model", "type": "unavailable_error", "code": 503}}
NOT_FOUND = {"error": {"message": "File Not Found", "type": "not_found_error", "code": 404}}


def _finish_reason(result: CompletionResult) -> str:
    return "stop" if result.stop_type in ("eos", "word") else "length"


def _usage(result: CompletionResult) -> dict[str, Any]:
    return {"completion_tokens": result.n_decoded, "prompt_tokens": result.n_prompt_tokens,
            "total_tokens": result.n_decoded + result.n_prompt_tokens,
            "prompt_tokens_details": {"cached_tokens": result.timings.cache_n}}


class Dialect:
    """The shapes of one completion endpoint, for one task.

    `reasoning`: the simulator's reasoning mode, the first N generated tokens are thinking. The chat,
    Responses and Messages dialects stream them as their APIs' reasoning deltas (the others ignore
    it); they count in the usage and timings like any generated token, as llama-server counts them.
    """

    has_done_marker = True
    reasoning = 0

    def thinking(self, event: TokenEvent) -> bool:
        return event.n_decoded <= self.reasoning

    def __init__(self, task: Task, model: str):
        self.task = task
        self.params: CompletionParams = task.params
        self.model = model  # llama-server names its own model, whatever the request said
        self.created = int(time.time())

    def partial(self, event: TokenEvent) -> list[dict[str, Any]]:
        raise NotImplementedError

    def final_stream(self, result: CompletionResult) -> list[dict[str, Any]]:
        raise NotImplementedError

    def final(self, result: CompletionResult) -> dict[str, Any]:
        raise NotImplementedError

    def _oai(self, obj: dict[str, Any], object_name: str) -> dict[str, Any]:
        return {**obj, "created": self.created, "model": self.model, "system_fingerprint": BUILD_INFO,
                "object": object_name}


class NativeDialect(Dialect):
    """`POST /completion`: the stream ends with the full final object and no `[DONE]`."""

    has_done_marker = False

    def partial(self, event: TokenEvent) -> list[dict[str, Any]]:
        # llama-server leaves id_slot unset (-1) in partial results; only the final one has it.
        chunk: dict[str, Any] = {
            "index": 0, "content": event.text, "tokens": [event.token], "stop": False, "id_slot": -1,
            "tokens_predicted": event.n_decoded, "tokens_evaluated": event.n_prompt_tokens,
        }
        if event.timings is not None:
            chunk["timings"] = event.timings.to_json()
        return [chunk]

    def final_stream(self, result: CompletionResult) -> list[dict[str, Any]]:
        # The text and tokens went out in the partial chunks already.
        return [self._final(result, content="", tokens=[])]

    def final(self, result: CompletionResult) -> dict[str, Any]:
        return self._final(result, content=result.content, tokens=list(result.tokens))

    def _final(self, result: CompletionResult, content: str, tokens: list[int]) -> dict[str, Any]:
        return {
            "index": 0,
            "content": content,
            "tokens": tokens,
            "id_slot": result.id_slot,
            "stop": True,
            "model": self.model,
            "tokens_predicted": result.n_decoded,
            "tokens_evaluated": result.n_prompt_tokens,
            "generation_settings": self.params.to_json(),
            "prompt": self.params.prompt_text,
            "has_new_line": result.has_new_line,
            "truncated": result.truncated,
            "stop_type": result.stop_type,
            "stopping_word": result.stopping_word,
            "tokens_cached": result.n_tokens_cached,
            "timings": result.timings.to_json(),
        }


class CompletionDialect(Dialect):
    """`POST /v1/completions`: usage and timings on the final chunk, then `[DONE]`."""

    def partial(self, event: TokenEvent) -> list[dict[str, Any]]:
        chunk = self._oai({"choices": [{"text": event.text, "index": 0, "logprobs": None, "finish_reason": None}]},
                          "text_completion")
        chunk["id"] = self.task.completion_id
        if event.timings is not None:
            chunk["timings"] = event.timings.to_json()
        return [chunk]

    def final_stream(self, result: CompletionResult) -> list[dict[str, Any]]:
        return [self._final(result, text="")]

    def final(self, result: CompletionResult) -> dict[str, Any]:
        return self._final(result, text=result.content)

    def _final(self, result: CompletionResult, text: str) -> dict[str, Any]:
        body = self._oai({"choices": [{"text": text, "index": 0, "logprobs": None,
                                       "finish_reason": _finish_reason(result)}]}, "text_completion")
        body["usage"] = _usage(result)
        body["id"] = self.task.completion_id
        body["timings"] = result.timings.to_json()
        return body


class ChatDialect(Dialect):
    """`POST /v1/chat/completions`: a role delta first; usage only with stream_options.include_usage."""

    def partial(self, event: TokenEvent) -> list[dict[str, Any]]:
        deltas: list[dict[str, Any]] = []
        if event.n_decoded == 1:  # OpenAI clients expect the role before any content
            deltas.append({"role": "assistant", "content": None})
        if event.text:
            deltas.append({"reasoning_content" if self.thinking(event) else "content": event.text})
        chunks = [self._chunk(delta, None) for delta in deltas]
        if chunks and event.timings is not None:
            chunks[-1]["timings"] = event.timings.to_json()
        return chunks

    def final_stream(self, result: CompletionResult) -> list[dict[str, Any]]:
        chunks = [self._chunk({}, _finish_reason(result))]
        if self.params.include_usage:
            usage_chunk = {"choices": [], "created": self.created, "id": self.task.completion_id, "model": self.model,
                           "system_fingerprint": BUILD_INFO, "object": "chat.completion.chunk",
                           "usage": _usage(result)}
            chunks.append(usage_chunk)
        chunks[-1]["timings"] = result.timings.to_json()
        return chunks

    def final(self, result: CompletionResult) -> dict[str, Any]:
        choice = {"finish_reason": _finish_reason(result), "index": 0,
                  "message": {"role": "assistant", "content": result.content}}
        body = self._oai({"choices": [choice]}, "chat.completion")
        body["usage"] = _usage(result)
        body["id"] = self.task.completion_id
        body["timings"] = result.timings.to_json()
        return body

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
        return {"choices": [{"finish_reason": finish_reason, "index": 0, "delta": delta}], "created": self.created,
                "id": self.task.completion_id, "model": self.model, "system_fingerprint": BUILD_INFO,
                "object": "chat.completion.chunk"}


class ResponsesDialect(Dialect):
    """`POST /v1/responses`: named events, `response.output_text.delta` per token, and
    `response.completed` (usage, with llama-server's timings beside it) last; no `[DONE]`."""

    has_done_marker = False

    def partial(self, event: TokenEvent) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if event.n_decoded == 1:
            rid = f"resp_{self.task.completion_id}"
            out += [{"type": "response.created", "response": {"id": rid, "object": "response", "status": "in_progress"}},
                    {"type": "response.in_progress",
                     "response": {"id": rid, "object": "response", "status": "in_progress"}},
                    {"type": "response.output_item.added",
                     "item": {"content": [], "id": self._item(), "role": "assistant", "status": "in_progress",
                              "type": "message"}},
                    {"type": "response.content_part.added", "item_id": self._item(),
                     "part": {"type": "output_text", "text": ""}}]
        if event.text:
            kind = "response.reasoning_text.delta" if self.thinking(event) else "response.output_text.delta"
            out.append({"type": kind, "item_id": self._item(), "delta": event.text})
        return out

    def final_stream(self, result: CompletionResult) -> list[dict[str, Any]]:
        part = {"type": "output_text", "annotations": [], "logprobs": [], "text": result.content}
        return [{"type": "response.output_text.done", "item_id": self._item(), "text": result.content},
                {"type": "response.content_part.done", "item_id": self._item(), "part": part},
                {"type": "response.output_item.done", "item": self._message(result)},
                {"type": "response.completed", "response": self._response(result),
                 "timings": result.timings.to_json()}]

    def final(self, result: CompletionResult) -> dict[str, Any]:
        return self._response(result)  # llama-server sends no timings in a whole response

    def _item(self) -> str:
        return f"msg_{self.task.completion_id}"

    def _message(self, result: CompletionResult) -> dict[str, Any]:
        return {"type": "message", "status": "completed", "id": self._item(), "role": "assistant",
                "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": result.content}]}

    def _response(self, result: CompletionResult) -> dict[str, Any]:
        return {"id": f"resp_{self.task.completion_id}", "object": "response", "created_at": self.created,
                "status": "completed", "model": self.model, "output": [self._message(result)],
                "usage": {"input_tokens": result.n_prompt_tokens, "output_tokens": result.n_decoded,
                          "total_tokens": result.n_prompt_tokens + result.n_decoded,
                          "input_tokens_details": {"cached_tokens": result.timings.cache_n}}}


class MessagesDialect(Dialect):
    """`POST /v1/messages`: named events from `message_start` to `message_stop`; no timings, no
    `[DONE]`. Anthropic's `input_tokens` leaves out the tokens read from the cache."""

    has_done_marker = False

    def partial(self, event: TokenEvent) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if event.n_decoded == 1:
            # The token event does not say how much of the prompt came from the cache: the start
            # names the whole prompt, and the final message_delta the split (cache reads apart).
            out += [{"type": "message_start", "message": {
                        "id": self.task.completion_id, "type": "message", "role": "assistant", "content": [],
                        "model": self.model, "stop_reason": None, "stop_sequence": None,
                        "usage": {"input_tokens": event.n_prompt_tokens, "output_tokens": 0}}},
                    self._block_start(0, thinking=self.reasoning > 0)]
        if self.reasoning and event.n_decoded == self.reasoning + 1:  # the thinking block ends, the text begins
            out += [{"type": "content_block_stop", "index": 0}, self._block_start(1, thinking=False)]
        if event.text:
            if self.thinking(event):
                delta = {"type": "thinking_delta", "thinking": event.text}
            else:
                delta = {"type": "text_delta", "text": event.text}
            out.append({"type": "content_block_delta", "index": int(self.reasoning > 0 and not self.thinking(event)),
                        "delta": delta})
        return out

    @staticmethod
    def _block_start(index: int, thinking: bool) -> dict[str, Any]:
        block = {"type": "thinking", "thinking": ""} if thinking else {"type": "text", "text": ""}
        return {"type": "content_block_start", "index": index, "content_block": block}

    def final_stream(self, result: CompletionResult) -> list[dict[str, Any]]:
        last_block = int(self.reasoning > 0 and result.n_decoded > self.reasoning)
        return [{"type": "content_block_stop", "index": last_block},
                {"type": "message_delta", "delta": {"stop_reason": self._stop_reason(result), "stop_sequence": None},
                 "usage": self._usage(result)},
                {"type": "message_stop"}]

    def final(self, result: CompletionResult) -> dict[str, Any]:
        return {"id": self.task.completion_id, "type": "message", "role": "assistant",
                "content": [{"type": "text", "text": result.content}], "model": self.model,
                "stop_reason": self._stop_reason(result), "stop_sequence": None, "usage": self._usage(result)}

    @staticmethod
    def _usage(result: CompletionResult) -> dict[str, Any]:
        cached = result.timings.cache_n
        return {"cache_read_input_tokens": cached, "input_tokens": result.n_prompt_tokens - cached,
                "output_tokens": result.n_decoded}

    @staticmethod
    def _stop_reason(result: CompletionResult) -> str:
        return "end_turn" if result.stop_type in ("eos", "word") else "max_tokens"


DIALECTS: dict[Api, type[Dialect]] = {
    Api.NATIVE: NativeDialect,
    Api.OAI_COMPLETION: CompletionDialect,
    Api.OAI_CHAT: ChatDialect,
    Api.OAI_RESPONSES: ResponsesDialect,
    Api.ANTHROPIC_MESSAGES: MessagesDialect,
}


# --- the management endpoints ----------------------------------------------------------------------

def props(profile: Profile, n_slots: int, metrics_enabled: bool) -> dict[str, Any]:
    return {
        "default_generation_settings": {"params": default_params().to_json(only_metrics=True), "n_ctx": profile.n_ctx},
        "total_slots": n_slots,
        "model_alias": profile.model_alias,
        "model_ftype": MODEL_FTYPE,
        "model_path": profile.model_path,
        "modalities": {"vision": profile.image_tokens > 0, "video": False, "audio": False},
        "media_marker": "<__media__>",
        "endpoint_slots": True,
        "endpoint_props": False,
        "endpoint_metrics": metrics_enabled,
        "ui": False,
        "ui_settings": {},
        "chat_template": CHAT_TEMPLATE,
        "chat_template_caps": CHAT_TEMPLATE_CAPS,
        "bos_token": "",
        "eos_token": EOS_TEXT,
        "build_info": BUILD_INFO,
        "is_sleeping": False,
        "cors_proxy_enabled": False,
    }


def slot_json(slot: Slot) -> dict[str, Any]:
    """One `/slots` entry. A slot that never served a task has only its first four keys."""
    out: dict[str, Any] = {"id": slot.id, "n_ctx": slot.n_ctx, "speculative": False,
                           "is_processing": slot.is_processing}
    task = slot.last_task
    if task is not None:
        out["id_task"] = task.id
        out["n_prompt_tokens"] = len(slot.cache)
        out["n_prompt_tokens_processed"] = slot.n_prompt_processed
        out["n_prompt_tokens_cache"] = slot.n_prompt_cached
        out["params"] = task.params.to_json(only_metrics=True)
        out["next_token"] = [{"has_next_token": slot.is_processing, "has_new_line": slot.has_new_line,
                              "n_remain": slot.n_remaining(), "n_decoded": slot.n_decoded}]
    return out


def models(profile: Profile) -> dict[str, Any]:
    alias = profile.model_alias
    return {
        "models": [{"name": alias, "model": alias, "modified_at": "", "size": "", "digest": "", "type": "model",
                    "description": "", "tags": [""], "capabilities": ["completion"], "parameters": "",
                    "details": {"parent_model": "", "format": "gguf", "family": "", "families": [""],
                                "parameter_size": "", "quantization_level": ""}}],
        "object": "list",
        "data": [{"id": alias, "aliases": [alias], "tags": [], "object": "model",
                  "architecture": {"input_modalities": ["text"], "output_modalities": ["text"]},
                  "created": int(time.time()), "owned_by": "llamacpp",
                  "meta": {"vocab_type": 2, "n_vocab": N_VOCAB, "n_ctx": profile.n_ctx,
                           "n_ctx_train": profile.n_ctx_train, "n_embd": N_EMBD, "n_params": profile.n_params,
                           "size": profile.size_bytes, "ftype": MODEL_FTYPE}}],
    }
