"""The salt every request puts in front of its prompt, so no prompt cache ever fakes a result.

A salt is SALT_DIGITS random decimal digits, the shortest text that keeps requests apart: 16 digits
are 53 random bits, so among a million requests the odds that any two share a salt are under 1 in
10,000 (n² / 2·10¹⁶), and a repeated salt costs one cached prefix, not a wrong result. Decimal
digits, not hex: tokenizers split digit runs by fixed rules (one token per digit on SmolLM2 and
Llama 2, groups of up to three on Llama 3, Qwen and the simulator), so every salt is the same number
of tokens, which exact prompt lengths (`--prompt-tokens`, a replayed trace) need. As "[<salt>] " in
front of the prompt it costs 18 tokens on the test bed's SmolLM2 and 8 on the simulator's
tokenizer (docs/results.md "Prompt lengths"), where the UUID it replaced cost 31 to 39.
"""

from __future__ import annotations

import os
import random

SALT_DIGITS = 16
_SALT_SPAN = 10**SALT_DIGITS


def new_salt() -> str:
    """SALT_DIGITS random decimal digits, leading zeros kept (every salt has the same length).

    Made by a private `random.Random` seeded from the OS (again in a forked child): a salt must
    differ from every other request's, not resist an attacker, and this is cheap enough for
    thousands of requests/s.
    """
    return f"{_randbelow(_SALT_SPAN):016d}"


_salts = random.Random()  # private: nobody's random.seed() makes salts repeat
os.register_at_fork(after_in_child=_salts.seed)
_randbelow = _salts.randrange

# Every salt is now one of a fixed token count; the name stays for the callers that need exactly that.
new_decimal_salt = new_salt
