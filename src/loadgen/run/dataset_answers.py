"""`--n-predict dataset`: each request asks for as many tokens as its dataset entry's recorded
answer, as vLLM's ShareGPT benchmark does (with --ignore-eos, exactly that many).

An entry's answer is, with `--dataset-answer-field NAME`, that field: a number (tokens) or a string
(text); without it, a ShareGPT conversation's first gpt/assistant turn after its first human turn
(or a chat "messages" list's). Entries without an answer are left out, and counted.

Per target, the answer texts are counted with that server's `/tokenize` (so each server generates
its own tokenizer's length of the recorded answer), and so are the prompts: an entry whose prompt
and answer do not fit the server's per-slot context is skipped on that target, with a count, never
cut. A server without /tokenize gets estimates (0.75 words per token) and a note.

`DatasetAnswerSource` is the run's request source when the config holds dataset entries with their
answers (run/request_source.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..client.backends import GenerationParams
from ..client.tokenize import TokenizeUnavailable, server_tokenizer
from ..core.workload import DatasetEntry, RequestShape
from .config import SweepConfig
from .engine import DEFAULT_OPTIONS, EngineOptions
from .exact_prompt import WORDS_PER_TOKEN
from .prompts import PromptSource, PromptSourceError, dataset_items, field_value, prompt_of
from .state import RunObserver, TargetRun, slot_context

ASSISTANT = ("gpt", "assistant", "model")


def _answer_turn(item: dict[str, Any]) -> str | None:
    """The first assistant turn after the first human turn of a ShareGPT or chat conversation."""
    for key, who_key, text_key in (("conversations", "from", "value"), ("messages", "role", "content")):
        turns = item.get(key)
        if not isinstance(turns, list):
            continue
        asked = False
        for turn in turns:
            if not isinstance(turn, dict):
                continue
            if turn.get(who_key) in ("human", "user"):
                asked = True
            elif asked and turn.get(who_key) in ASSISTANT:
                text = turn.get(text_key)
                return text if isinstance(text, str) and text.strip() else None
        return None
    return None


def _answer_of(item: Any, answer_field: str | None) -> int | str | None:
    if not isinstance(item, dict):
        return None
    if answer_field is not None:
        value = field_value(item, answer_field)
        if isinstance(value, bool):
            return None
        if isinstance(value, int):
            return value if value > 0 else None
        return value if isinstance(value, str) and value.strip() else None
    return _answer_turn(item)


def read_dataset_entries(path: str, field: str, answer_field: str | None) -> tuple[list[DatasetEntry], int]:
    """Every entry of a JSONL or JSON dataset with a prompt and an answer, in file order, and how
    many entries had no answer (left out)."""
    entries: list[DatasetEntry] = []
    missing = 0
    for where, item in dataset_items(path):
        prompt, problem = prompt_of(item, field)
        if problem:
            raise PromptSourceError(f"{where}: {problem}")
        answer = _answer_of(item, answer_field)
        if not prompt or not prompt.strip():
            continue
        if answer is None:
            missing += 1
            continue
        entries.append(DatasetEntry(prompt, answer))
    if not entries:
        what = f"field {answer_field!r}" if answer_field else "a ShareGPT answer turn"
        raise PromptSourceError(f"--dataset {path}: no entry has an answer ({what}); set --dataset-answer-field")
    return entries, missing


def _estimate(text: str) -> int:
    return max(1, round(len(text.split()) / WORDS_PER_TOKEN))


async def entry_tokens(config: SweepConfig, t: TargetRun,
                       entries: tuple[DatasetEntry, ...]) -> tuple[list[tuple[int, int]], bool]:
    """Per entry (prompt tokens, answer tokens) on this target's tokenizer, and whether they are
    estimates (the server has no /tokenize)."""
    out: list[tuple[int, int]] = []
    try:
        async with server_tokenizer(t.target.probe_url, headers=config.auth_headers(), timeout_s=config.timeout_s,
                                    insecure=config.insecure) as tokenizer:
            specials = await tokenizer.specials()
            for e in entries:
                prompt = await tokenizer.count(e.prompt)
                answer = e.answer if isinstance(e.answer, int) else \
                    max(1, await tokenizer.count(e.answer) - specials)
                out.append((prompt, answer))
        return out, False
    except TokenizeUnavailable:
        return [(_estimate(e.prompt), e.answer if isinstance(e.answer, int) else _estimate(e.answer))
                for e in entries], True


async def dataset_generation(config: SweepConfig, t: TargetRun, obs: RunObserver,
                             entries: tuple[DatasetEntry, ...]
                             ) -> tuple[GenerationParams, EngineOptions, tuple[RequestShape, ...]] | None:
    """The entries that fit this target, one body each asking for its answer's length, and their
    shapes; None (the target's error set) when none fits."""
    counts, estimated = await entry_tokens(config, t, entries)
    n_ctx = slot_context(t)
    kept = [(e, p, a) for e, (p, a) in zip(entries, counts) if n_ctx is None or p + a <= n_ctx]
    t.dataset_fit = (len(entries), len(entries) - len(kept))
    if estimated:
        obs.message(f"{t.label}: the server has no /tokenize: answer lengths are estimated at "
                    f"{WORDS_PER_TOKEN} words per token")
    if len(kept) < len(entries):
        obs.message(f"{t.label}: {len(entries) - len(kept)} of {len(entries)} dataset entries skipped: prompt + "
                    f"answer longer than the per-slot context ({n_ctx:,} tokens)")
    if not kept:
        t.error = f"{t.target.display}: no dataset entry fits the per-slot context ({n_ctx:,} tokens)"
        return None
    generation = replace(config.generation, prompt=kept[0][0].prompt, prompts=tuple(e.prompt for e, _, _ in kept),
                         n_predicts=tuple(a for _, _, a in kept), n_predict=max(a for _, _, a in kept))
    return generation, DEFAULT_OPTIONS, tuple(RequestShape(None, a) for _, _, a in kept)


@dataclass(frozen=True, slots=True)
class DatasetAnswerSource:
    """A request source (run/request_source.py): each entry's prompt asking for its answer's length,
    `dataset_generation`."""

    entries: tuple[DatasetEntry, ...]
    name = "dataset-answers"

    @classmethod
    def from_config(cls, config: SweepConfig, prompt_tokens: int | None,
                    prompt_source: PromptSource) -> DatasetAnswerSource | None:
        return cls(config.dataset_entries) if config.dataset_entries else None

    def describe(self) -> str:
        return f"{len(self.entries):,} dataset entries, each asking for its recorded answer's length"

    async def build(self, config: SweepConfig, t: TargetRun, obs: RunObserver, options: EngineOptions
                    ) -> tuple[GenerationParams, EngineOptions, tuple[RequestShape, ...]] | None:
        answered = await dataset_generation(config, t, obs, self.entries)
        if answered is None:
            return None
        generation, dataset_options, shapes = answered
        return generation, replace(options, salt=dataset_options.salt), shapes
