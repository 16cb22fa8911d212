"""Prompt sources and exact-length prompts, without a real server (the simulator has /tokenize)."""

from __future__ import annotations

import asyncio
import json
import re

import aiohttp
import pytest

from loadgen.client.tokenize import ServerTokenizer
from loadgen.run.exact_prompt import FittedPrompt, PromptTooShort, fit_prompt, fit_prompts, salted
from loadgen.run.prompts import PromptSourceError, read_dataset, repeat_to, sample_prompts, synthetic_text
from loadgen.run.salts import new_decimal_salt
from loadgen.sim import load_profile, start_simulator
from loadgen.sim.tokenizer import tokenize

SMOKE = load_profile("smoke")


def test_decimal_salt_is_sixteen_digits():
    salts = {new_decimal_salt() for _ in range(200)}
    assert len(salts) == 200
    for s in salts:
        assert re.fullmatch(r"\d{16}", s)


def test_the_salt_costs_eight_tokens_on_the_simulators_tokenizer():
    # "[" + 16 digits in groups of three (6 pieces) + "]"; the space joins the first word after it.
    # The UUID salt it replaced cost 19 here (38 on SmolLM2), flooring every short prompt.
    counts = {len(tokenize(salted(new_decimal_salt(), "x"))) - 1 for _ in range(200)}
    assert counts == {8}


def test_synthetic_text_is_seeded_and_long_enough():
    a, b = synthetic_text(5000, seed=3), synthetic_text(5000, seed=3)
    assert a == b and len(a) >= 5000 and a != synthetic_text(5000, seed=4)
    assert repeat_to("ab", 7) == "ab\n\nab\n\nab"


def test_jsonl_dataset_with_a_nested_field_and_sharegpt_lines(tmp_path):
    path = tmp_path / "d.jsonl"
    lines = [{"input": {"text": "first"}}, {"conversations": [{"from": "system", "value": "be nice"},
                                                              {"from": "human", "value": "second"}]},
             {"input": {"text": "  "}}]  # empty prompts are skipped
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    assert read_dataset(str(path), "input.text") == ["first", "second"]


def test_sharegpt_json_array(tmp_path):
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps([
        {"id": "a", "conversations": [{"from": "human", "value": "q1"}, {"from": "gpt", "value": "a1"}]},
        {"id": "b", "conversations": [{"from": "gpt", "value": "hello"}, {"from": "human", "value": "q2"}]},
        {"id": "c", "messages": [{"role": "user", "content": "q3"}]},
    ]))
    assert read_dataset(str(path)) == ["q1", "q2", "q3"]


@pytest.mark.parametrize("content,message", [
    ('{"prompt": "ok"}\n{"prompt": 3}\n', ":2: field 'prompt' is int"),
    ('{"prompt": "ok"}\n{"text": "x"}\n', ":2: no field 'prompt'"),
    ('{"prompt": "ok"}\nnot json\n', ":2: not a JSON line"),
    ("[1, 2]", "item 0: expected a JSON object"),
    ("", "the file is empty"),
])
def test_bad_datasets_name_the_line(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(PromptSourceError, match=re.escape(message)):
        read_dataset(str(path))


def test_sampling_is_seeded():
    pool = [f"p{i}" for i in range(50)]
    assert sample_prompts(pool, 10, 7) == sample_prompts(pool, 10, 7)
    assert sample_prompts(pool, 10, 7) != sample_prompts(pool, 10, 8)
    assert sorted(sample_prompts(pool, None, 1)) == sorted(pool)


def run(coro, timeout: float = 30):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def test_fitted_prompts_are_exactly_n_tokens_with_any_salt():
    async def main():
        async with await start_simulator(SMOKE, slots=1) as sim:
            fitted = await fit_prompts(sim.url, lambda n: synthetic_text(n, 0), [40, 256, 2000])
        return fitted

    fitted = run(main())
    for n, f in fitted.items():
        assert f.exact and f.note() is None and f.method == "tokenize"
        for _ in range(5):
            assert len(tokenize(salted(new_decimal_salt(), f.body))) == n


def test_a_length_below_the_salt_is_refused():
    async def main():
        async with await start_simulator(SMOKE, slots=1) as sim, aiohttp.ClientSession() as session:
            await fit_prompt(ServerTokenizer(session, sim.url), lambda n: synthetic_text(n), 5)

    with pytest.raises(PromptTooShort, match="ask for at least"):
        run(main())


def test_without_tokenize_the_length_is_estimated_with_a_note():
    from aiohttp import web

    async def main():
        app = web.Application()  # a server without /tokenize: every path 404s
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            return await fit_prompts(f"http://127.0.0.1:{port}", lambda n: synthetic_text(n), [1000])
        finally:
            await runner.cleanup()

    f = run(main())[1000]
    assert f.method == "estimate" and f.measured_tokens is None and not f.exact
    assert "no /tokenize" in f.note()
    assert 500 < len(f.body.split()) < 1000


def test_a_varying_salt_is_reported():
    class HexSplitting:  # a tokenizer where letters merge: salts differ in token count
        async def pieces(self, text):
            return [p.encode() for p in re.findall(r"[a-z]+|\S| ", text)]

        async def count(self, text):
            return len(await self.pieces(text))

        async def specials(self):
            return 1

    salts = iter(["1234-ab", "1234-ab", "1-abc", "12-a-b", "1-2-3-4-a"] * 4)
    f = run(fit_prompt(HexSplitting(), lambda n: synthetic_text(n), 100, salt=lambda: next(salts)))
    assert isinstance(f, FittedPrompt) and f.measured_tokens == 100 and f.salt_spread > 0
    assert "varying number of tokens" in f.note()


@pytest.mark.parametrize("wanted, salt, template, expected", [
    (10, 14, 0, "10 tokens are too few: the salt takes 14; ask for at least 15"),
    (20, 14, 3, "20 tokens are too few: the salt takes 14, the chat template 3; ask for at least 18"),
    # SmolLM2's template adds a system prompt of ~30 tokens: the template, not the salt, is to blame
    (32, 14, 31, "32 tokens are too few: the chat template's system prompt takes 31; ask for 46+"),
])
def test_a_prompt_too_short_blames_what_takes_the_tokens(wanted, salt, template, expected):
    from loadgen.run.exact_prompt import too_short

    assert too_short(wanted, salt, template) == expected
    assert len(f"--prompt-tokens: {expected}") <= 100
