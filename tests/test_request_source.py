"""Request sources (run/request_source.py): which one a config picks, and what each builds for a
target. A fake tokenizer stands in for the server's /tokenize (one token per run of letters, per
other character, plus a BOS), so every build runs in-process, with no server and no socket."""

from __future__ import annotations

import asyncio
import contextlib
import re
from dataclasses import replace

import pytest

from loadgen.client.backends import GenerationParams
from loadgen.client.tokenize import TokenizeUnavailable
from loadgen.core.cache_mode import SharedPrefix
from loadgen.core.workload import DatasetEntry, Workload, parse_length_spec
from loadgen.run import dataset_answers, exact_prompt, shared_prefix, trace_prompts
from loadgen.run.config import SweepConfig, Target
from loadgen.run.engine import DEFAULT_OPTIONS, EngineOptions
from loadgen.run.exact_prompt import salted
from loadgen.run.prompts import PromptSource
from loadgen.run.request_source import SOURCES, source_for
from loadgen.run.salts import new_decimal_salt
from loadgen.run.state import TargetRun
from loadgen.run.target_setup import target_generation
from loadgen.run.trace_replay import TraceRequest, plan_replay

URL = "http://127.0.0.1:9"  # never asked: the tokenizer is faked
WORKLOAD = Workload(parse_length_spec("uniform:40:90"), parse_length_spec("uniform:4:16", "--n-predict"), seed=3,
                    shapes=6)
# Scaled by 0.05: blocks of 26 tokens, prompts of 120, 110 and 60 tokens.
REPLAY = plan_replay([TraceRequest(0, 2400, 8, (1, 2)), TraceRequest(10, 2200, 9, (1, 3)),
                      TraceRequest(20, 1200, 10, ())], scale_lengths=0.05)
ENTRIES = (DatasetEntry("What is a KV cache?", 12), DatasetEntry("Name a tokenizer.", "SentencePiece, for one."))
PREFIX = SharedPrefix(prefix_tokens=30, groups=2, prompt_tokens=80)


class WordTokenizer:
    """A tokenizer with the server's interface: a run of letters is one token, any other character
    one; `count` adds the BOS."""

    async def pieces(self, text: str) -> list[bytes]:
        return [p.encode() for p in re.findall(r"[A-Za-z]+|.", text, re.DOTALL)]

    async def count(self, text: str) -> int:
        return len(await self.pieces(text)) + 1

    async def specials(self) -> int:
        return 1

    async def template_overhead(self) -> int:
        return 0


class NoTokenizer(WordTokenizer):
    """A server without /tokenize."""

    async def pieces(self, text: str) -> list[bytes]:
        raise TokenizeUnavailable("/tokenize answered HTTP 404")

    async def count(self, text: str) -> int:
        raise TokenizeUnavailable("/tokenize answered HTTP 404")

    async def specials(self) -> int:
        raise TokenizeUnavailable("/tokenize answered HTTP 404")


@pytest.fixture
def tokenizer(monkeypatch):
    """Every source's `server_tokenizer` gives the fake; set `.kind` to NoTokenizer for none."""
    class Switch:
        kind: type[WordTokenizer] = WordTokenizer

    @contextlib.asynccontextmanager
    async def fake(base_url, **_):
        yield Switch.kind()

    for module in (exact_prompt, shared_prefix, dataset_answers, trace_prompts):
        monkeypatch.setattr(module, "server_tokenizer", fake)
    return Switch


class Messages:
    def __init__(self):
        self.said: list[str] = []

    def message(self, text: str) -> None:
        self.said.append(text)


def config(**fields) -> SweepConfig:
    return SweepConfig(targets=(Target(URL),), concurrency=(1,), generation=GenerationParams(prompt="Hello there"),
                       **fields)


def tokens(text: str) -> int:
    return asyncio.run(WordTokenizer().count(text))


# ------------------------------------------------------------------ which source
# Written down before the first run: today's precedence is shared prefix, dataset answers, a trace,
# a drawn workload, a fixed prompt_tokens (0 or None: none), then the prompts as given.
@pytest.mark.parametrize("fields, prompt_tokens, expected", [
    ({}, None, "fixed"),
    ({}, 0, "fixed"),
    ({}, 128, "exact-length"),
    ({"workload": WORKLOAD}, None, "drawn-lengths"),
    ({"workload": WORKLOAD}, 128, "drawn-lengths"),
    ({"replay": REPLAY}, None, "trace"),
    ({"replay": REPLAY, "workload": WORKLOAD}, 128, "trace"),
    ({"dataset_entries": ENTRIES}, None, "dataset-answers"),
    ({"dataset_entries": ENTRIES, "replay": REPLAY, "workload": WORKLOAD}, 128, "dataset-answers"),
    ({"dataset_entries": ()}, None, "fixed"),
    ({"shared_prefix": PREFIX}, None, "shared-prefix"),
    ({"shared_prefix": PREFIX, "dataset_entries": ENTRIES, "replay": REPLAY, "workload": WORKLOAD}, 128,
     "shared-prefix"),
])
def test_the_config_picks_its_source_in_todays_order(fields, prompt_tokens, expected):
    source = source_for(config(**fields), prompt_tokens, PromptSource())
    assert source.name == expected
    line = source.describe()
    assert line and "\n" not in line


def test_every_source_is_in_the_one_list_once_and_the_prompts_as_given_come_last():
    everything = config(shared_prefix=PREFIX, dataset_entries=ENTRIES, replay=REPLAY, workload=WORKLOAD)
    names = [kind(everything, 128, PromptSource()).name for kind in SOURCES]  # each takes a config that asks for all
    assert names == ["shared-prefix", "dataset-answers", "trace", "drawn-lengths", "exact-length", "fixed"]
    assert [kind(config(), None, PromptSource()) is None for kind in SOURCES] == [True] * 5 + [False]


# ------------------------------------------------------------------ what each builds
def build(cfg: SweepConfig, prompt_tokens: int | None = None, options: EngineOptions = DEFAULT_OPTIONS,
          source: PromptSource | None = None):
    t = TargetRun(cfg.targets[0], "fake")
    said = Messages()
    built = asyncio.run(target_generation(cfg, t, said, source or PromptSource(), prompt_tokens, options))
    return built, t, said


CALLERS = EngineOptions(salt=None, give_up_after=None, pause_after_connect_error_s=2.0)  # a soak's kind


def test_the_prompts_as_given_are_sent_as_they_are_with_the_callers_options(tokenizer):
    cfg = config()
    (generation, options, shapes), t, _ = build(cfg, None, CALLERS)
    assert generation is cfg.generation and options is CALLERS and shapes == ()


def test_an_exact_length_cuts_every_text_to_that_many_tokens_with_fixed_size_salts(tokenizer):
    texts = PromptSource(texts=("Each slot holds a prompt and waits.", "The batch moves one layer at a time."))
    (generation, options, shapes), t, said = build(config(), 50, CALLERS, texts)
    assert len(generation.prompts) == 2 and generation.prompt == generation.prompts[0]
    assert [tokens(salted(new_decimal_salt(), body)) for body in generation.prompts] == [50, 50]
    assert options == replace(CALLERS, salt=new_decimal_salt) and shapes == ()
    assert t.error is None and said.said == []


def test_an_exact_length_too_short_for_the_salt_stops_the_target_with_its_reason(tokenizer):
    built, t, _ = build(config(), 10)
    assert built is None
    assert t.error == f"{URL}: --prompt-tokens: 10 tokens are too few: the salt takes 19; ask for at least 20"


def test_drawn_lengths_give_one_body_per_shape_of_its_drawn_length(tokenizer):
    (generation, options, shapes), _, _ = build(config(workload=WORKLOAD), None, CALLERS)
    assert shapes == WORKLOAD.draw() and len(shapes) == 6
    assert [tokens(salted(new_decimal_salt(), p)) for p in generation.prompts] == [s.prompt_tokens for s in shapes]
    assert generation.n_predicts == tuple(s.n_predict for s in shapes)
    assert options == replace(CALLERS, salt=new_decimal_salt)


def test_a_trace_shares_its_blocks_and_keeps_each_requests_length(tokenizer):
    (generation, options, shapes), t, _ = build(config(replay=REPLAY))
    assert shapes == REPLAY.shapes
    first, second, third = generation.prefixes
    assert first and second and first != second  # blocks (1, 2) and (1, 3)
    assert first.split("\n")[0] == second.split("\n")[0]  # block 1 on the wire in both, then 2 and 3
    assert first.split("\n")[1] != second.split("\n")[1]
    assert third == ""  # no blocks: salted at the start
    whole = [tokens(prefix + salted(new_decimal_salt(), body)) for prefix, body in zip(generation.prefixes,
                                                                                        generation.prompts)]
    assert whole == [s.prompt_tokens for s in shapes]
    assert options.salt is new_decimal_salt and t.lengths_floored is None


def test_a_trace_without_tokenize_falls_back_to_drawn_lengths_with_a_note(tokenizer):
    tokenizer.kind = NoTokenizer
    (generation, _, shapes), _, said = build(config(replay=REPLAY))
    assert shapes == REPLAY.shapes and generation.prefixes == ()
    assert any("no /tokenize: the trace's blocks are not shared" in m for m in said.said)


def test_dataset_answers_ask_for_each_entrys_answer_length_and_keep_the_callers_salt_off(tokenizer):
    (generation, options, shapes), t, _ = build(config(dataset_entries=ENTRIES), None, CALLERS)
    answer = tokens("SentencePiece, for one.") - 1  # the answer's tokens, no BOS
    assert generation.prompts == ("What is a KV cache?", "Name a tokenizer.")
    assert generation.n_predicts == (12, answer) and generation.n_predict == 12
    assert [s.n_predict for s in shapes] == [12, answer]
    assert options == replace(CALLERS, salt=None) and t.dataset_fit == (2, 0)


def test_a_shared_prefix_is_exact_and_each_whole_prompt_too(tokenizer):
    (generation, options, shapes), _, said = build(config(shared_prefix=PREFIX), None, CALLERS)
    assert len(generation.prefixes) == len(generation.prompts) == 2 and generation.cache_prompt
    assert [tokens(p) - 1 for p in generation.prefixes] == [30, 30]
    assert [tokens(p + salted(new_decimal_salt(), body)) for p, body in zip(generation.prefixes, generation.prompts)] \
        == [80, 80]
    assert options == replace(CALLERS, salt=new_decimal_salt) and shapes == ()
    assert said.said == [f"fake: {source_for(config(shared_prefix=PREFIX), None, PromptSource()).describe()}"]


def test_a_shared_prefix_without_tokenize_stops_the_target(tokenizer):
    tokenizer.kind = NoTokenizer
    built, t, _ = build(config(shared_prefix=PREFIX))
    assert built is None
    assert t.error == f"{URL}: a shared prefix is cut with the server's /tokenize, which it does not answer"
