"""Where a target's requests come from: the `RequestSource` interface, and the one list of sources.

A request source is asked one thing per target, before its warm-up: build the target's requests.
It answers with the request bodies (`GenerationParams`: the prompt or prompts, their prefixes and
n_predicts), the engine options their salts need (the caller's options with the source's salt:
fixed-size decimal salts where prompts are cut to a token count) and the request shapes a level
cycles through (empty: one shape); or None, with the target's error set, when they cannot be built
for this target. It has a short `name` and a one-line `describe()`.

    name             module                    what the config asks for
    shared-prefix    run/shared_prefix.py      a shared-prefix cache mode (`config.shared_prefix`)
    dataset-answers  run/dataset_answers.py    --n-predict dataset (`config.dataset_entries`)
    trace            run/trace_prompts.py      a replayed trace (`config.replay`)
    drawn-lengths    run/workload_prompts.py   lengths drawn per request (`config.workload`)
    exact-length     run/exact_prompt.py       a fixed --prompt-tokens (the run kind's `prompt_tokens`)
    fixed            here                      nothing of the above: the config's prompts as given

`SOURCES` is that list, in that order, and the only one: `source_for` asks each kind in turn
whether the config is its (`from_config`), and the first that says yes builds. A source lives in
the module that holds its logic and imports nothing of this one (it meets the interface by its
shape, so this module can name them all without an import circle); the fixed prompts live here
because they have no logic to hold (run/prompts.py sits below the config, which names its
`PromptSource`, so it cannot name the config back).

Not a source: multi-turn conversations (run/multiturn.py, `loadgen chat`). A source builds every
body a target's levels send before the first one is sent; a conversation's turn k carries the
server's own answers to turns 0..k-1, which exist only once those turns have streamed back, so its
bodies are made at send time by its ConversationBackend (run/engine.py `TurnSender`), one level of
users × turns, not a cycle of shapes. They share the rest of a sweep's one path (transport,
backend, records). Nor are request classes (run/classes.py): each class is a drawn-lengths source
of its own workload (`DrawnLengthSource`), several at once on one target.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ..client.backends import GenerationParams
from ..core.workload import RequestShape
from .config import SweepConfig
from .dataset_answers import DatasetAnswerSource
from .engine import EngineOptions
from .exact_prompt import ExactLengthSource
from .prompts import PromptSource
from .shared_prefix import SharedPrefixSource
from .state import RunObserver, TargetRun
from .trace_prompts import TraceSource
from .workload_prompts import DrawnLengthSource

# What a source builds for one target: the bodies, the engine options with its salt, the shapes.
TargetRequests = tuple[GenerationParams, EngineOptions, tuple[RequestShape, ...]]


class RequestSource(Protocol):
    name: str  # short, for a message or a table: "trace", "exact-length"

    def describe(self) -> str:
        """One line for the user: what this source sends."""
        ...

    async def build(self, config: SweepConfig, t: TargetRun, obs: RunObserver,
                    options: EngineOptions) -> TargetRequests | None:
        """This target's requests (`options` with the salt they need); None, and `t.error` set, when
        they cannot be built for it. Notes for the user go to `obs.message`."""
        ...


@dataclass(frozen=True, slots=True)
class FixedPromptSource:
    """The config's prompts as given (the default prompt, --prompt, a prompt file or a dataset's
    texts), each salted at the start with the caller's salt: nothing to build per target."""

    prompts: int = 1
    name = "fixed"

    @classmethod
    def from_config(cls, config: SweepConfig, prompt_tokens: int | None,
                    prompt_source: PromptSource) -> FixedPromptSource:
        return cls(len(config.generation.prompt_list))

    def describe(self) -> str:
        return f"the prompt{'s' if self.prompts > 1 else ''} as given ({self.prompts:,}), salted at the start"

    async def build(self, config: SweepConfig, t: TargetRun, obs: RunObserver,
                    options: EngineOptions) -> TargetRequests | None:
        return config.generation, options, ()


# Every source, in the order a config is asked: the first whose `from_config` takes it builds the
# target's requests. The fixed prompts take every config, so they come last.
SourceKind = Callable[[SweepConfig, int | None, PromptSource], RequestSource | None]
SOURCES: tuple[SourceKind, ...] = (
    SharedPrefixSource.from_config,
    DatasetAnswerSource.from_config,
    TraceSource.from_config,
    DrawnLengthSource.from_config,
    ExactLengthSource.from_config,
    FixedPromptSource.from_config,
)


def source_for(config: SweepConfig, prompt_tokens: int | None, prompt_source: PromptSource) -> RequestSource:
    """The source of the requests this config asks for (`prompt_tokens`: the run kind's fixed
    length, None or 0 for none; `prompt_source`: the texts an exact length is cut from)."""
    for kind in SOURCES:
        source = kind(config, prompt_tokens, prompt_source)
        if source is not None:
            return source
    raise AssertionError("the fixed prompts take every config")
