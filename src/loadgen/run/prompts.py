"""Where prompt text comes from: built-in synthetic prose, a plain text file, or a dataset.

    synthetic      seeded English prose about serving LLMs (what `--prompt-tokens` fills with)
    --prompt-file  one UTF-8 text file, the whole file is one prompt
    --dataset      FILE.jsonl: one JSON object per line, the prompt in `--dataset-field` (default
                   "prompt"; dotted for nested objects: "input.text"); a ShareGPT line
                   ({"conversations": [{"from": "human", "value": ...}, ...]}) gives its first
                   human turn. FILE.json: a JSON array of such objects, or of strings (ShareGPT's
                   published files are such arrays).

A dataset's prompts are shuffled with `--dataset-seed` and the first `--dataset-samples` kept, so
the same seed draws the same prompts in the same order. Request i then uses prompt i mod count.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..core.errors import ConfigError

DEFAULT_FIELD = "prompt"
MAX_FITTED_PROMPTS = 16  # distinct exact-length prompts cut from a dataset, per target
SHAREGPT_HUMAN = ("human", "user")

_SUBJECTS = ("the router", "each expert", "the scheduler", "a decode step", "the prompt cache", "the batch",
             "every slot", "the KV cache", "a long prompt", "the server", "the attention layer", "the gateway",
             "the quantised model", "the memory bus", "a queued request", "the tokenizer", "the sampler")
_VERBS = ("reads", "writes", "waits for", "splits", "measures", "holds", "moves", "computes", "skips",
          "repeats", "shares", "schedules", "evicts", "fills", "streams", "compares", "limits")
_OBJECTS = ("the hidden state", "eight routed experts", "a shared expert", "the next token", "four slots",
            "sixteen thousand tokens", "the weights in memory", "one layer at a time", "the logits",
            "the whole context", "a fresh salt", "the first token", "the time per token", "the deferred queue",
            "a chunk of the prompt", "the expert cache", "every request in turn")
_TAILS = ("", "", " before the next step", " while the others wait", " on every request", " in one pass",
          " when the load rises", " without a cache", " across the bus", " at a fixed cost")


class PromptSourceError(ConfigError):
    """A prompt file or dataset that cannot be used; the message names the file (and line)."""


def synthetic_text(min_chars: int, seed: int = 0) -> str:
    """Seeded English prose of at least `min_chars` characters, the same for the same seed."""
    rng = random.Random(seed)
    parts: list[str] = []
    size = 0
    while size < min_chars:
        sentence = (f"{rng.choice(_SUBJECTS).capitalize()} {rng.choice(_VERBS)} "
                    f"{rng.choice(_OBJECTS)}{rng.choice(_TAILS)}.")
        parts.append(sentence)
        size += len(sentence) + 1
    return " ".join(parts)


def repeat_to(text: str, min_chars: int) -> str:
    """`text`, repeated with blank lines between copies until it has at least `min_chars`."""
    if not text:
        raise ValueError("cannot repeat an empty text")
    out = text
    while len(out) < min_chars:
        out = out + "\n\n" + text
    return out


def read_text_file(path: str, what: str = "--prompt-file") -> str:
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except OSError as exc:
        raise PromptSourceError(f"{what} {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise PromptSourceError(f"{what} {path}: not UTF-8 text") from None
    if not text.strip():
        raise PromptSourceError(f"{what} {path}: the file is empty")
    return text


def field_value(obj: Any, dotted: str) -> Any:
    """obj[a][b] for the dotted name "a.b"; None when a part is missing."""
    for part in dotted.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return None
        obj = obj[part]
    return obj


def _first_human_turn(obj: dict[str, Any]) -> Any:
    """ShareGPT {"conversations": [{"from", "value"}]} or chat {"messages": [{"role", "content"}]}."""
    for key, who_key, text_key in (("conversations", "from", "value"), ("messages", "role", "content")):
        turns = obj.get(key)
        if isinstance(turns, list):
            for turn in turns:
                if isinstance(turn, dict) and turn.get(who_key) in SHAREGPT_HUMAN:
                    return turn.get(text_key)
            return None
    return None


def prompt_of(item: Any, field: str) -> tuple[str | None, str | None]:
    """(prompt, None) or (None, why not) for one dataset item."""
    if isinstance(item, str):
        return item, None
    if not isinstance(item, dict):
        return None, f"expected a JSON object, got {type(item).__name__}"
    value = field_value(item, field)
    if value is None:
        value = _first_human_turn(item)
        if value is None:
            return None, (f"no field {field!r} (set --dataset-field) and no ShareGPT "
                          "conversations with a human turn")
    if not isinstance(value, str):
        return None, f"field {field!r} is {type(value).__name__}, not a string"
    return value, None


def _jsonl_items(path: str, text: str) -> Iterator[tuple[str, Any]]:
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield f"{path}:{n}", json.loads(line)
        except ValueError as exc:
            raise PromptSourceError(f"{path}:{n}: not a JSON line ({exc.args[0].split(':')[0]})") from None


def dataset_items(path: str) -> Iterator[tuple[str, Any]]:
    """(where, item) for every item of a JSONL or JSON-array dataset, in file order."""
    text = read_text_file(path, "--dataset")
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise PromptSourceError(f"--dataset {path}: not valid JSON ({exc})") from None
        return ((f"{path}: item {i}", item) for i, item in enumerate(data))
    return _jsonl_items(path, text)


def read_dataset(path: str, field: str = DEFAULT_FIELD) -> list[str]:
    """Every non-empty prompt of a JSONL or JSON dataset, in file order."""
    prompts: list[str] = []
    for where, item in dataset_items(path):
        prompt, problem = prompt_of(item, field)
        if problem:
            raise PromptSourceError(f"{where}: {problem}")
        if prompt and prompt.strip():
            prompts.append(prompt)
    if not prompts:
        raise PromptSourceError(f"--dataset {path}: no prompts found (field {field!r})")
    return prompts


T = TypeVar("T")  # a prompt, or a dataset entry with its answer


def sample_prompts(prompts: list[T], count: int | None, seed: int) -> list[T]:
    """Shuffle with `seed`, keep the first `count` (all when None): the same seed, the same draw."""
    order = list(prompts)
    random.Random(seed).shuffle(order)
    return order if count is None else order[:count]


@dataclass(frozen=True, slots=True)
class PromptSource:
    """The run's prompt texts (from --prompt, --prompt-file or --dataset), or none: synthetic prose."""

    texts: tuple[str, ...] = ()
    seed: int = 0

    @property
    def synthetic(self) -> bool:
        return not self.texts

    def text(self, min_chars: int, start: int = 0) -> str:
        """At least `min_chars` of text to cut a prompt from: the texts from number `start` on, in
        a cycle, separated by blank lines; or synthetic prose seeded with seed + start."""
        if self.synthetic:
            return synthetic_text(min_chars, self.seed + start)
        k = start % len(self.texts)
        return repeat_to("\n\n".join(self.texts[k:] + self.texts[:k]), min_chars)

    def variants(self) -> int:
        """How many distinct exact-length prompts to cut per target (one per text, up to a cap)."""
        return 1 if self.synthetic else min(len(self.texts), MAX_FITTED_PROMPTS)
