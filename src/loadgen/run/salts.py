"""The salt every request puts in front of its prompt, so no prompt cache ever fakes a result.

`new_salt` for every request; `new_decimal_salt` where the prompt must be an exact number of tokens
(`--prompt-tokens`): a salt of decimal digits costs every tokenizer the same number of tokens.
"""

from __future__ import annotations

import os
import random


def new_salt() -> str:
    """A random (version 4, RFC 4122 variant) UUID in its usual text form.

    Made by a private `random.Random` seeded from the OS (again in a forked child): a salt must
    differ from every other request's, not resist an attacker, and this costs a third of
    uuid.uuid4(), which shows at thousands of requests/s.
    """
    h = "%032x" % (_getrandbits(128) & _UUID4_CLEAR | _UUID4_SET)
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


_salts = random.Random()  # private: nobody's random.seed() makes salts repeat
os.register_at_fork(after_in_child=_salts.seed)
_getrandbits = _salts.getrandbits
_UUID4_CLEAR = ~(0xF << 76 | 0x3 << 62)  # the version nibble and the variant's two bits
_UUID4_SET = 0x4 << 76 | 0x2 << 62  # version 4, variant RFC 4122 (binary 10)


def new_decimal_salt() -> str:
    """A random version 4 UUID whose hex digits are all 0-9 (about 100 random bits).

    Tokenizers split runs of decimal digits by fixed rules (one token per digit, or per group of
    up to three), so every such salt is the same number of tokens, where a hex UUID's letters merge
    unpredictably (31 to 39 tokens on SmolLM2). Exact prompt lengths (`--prompt-tokens`) need that.
    """
    d = "".join(str(b % 10) for b in os.urandom(32))  # 256 % 10 != 0: a bias too small to matter here
    return f"{d[:8]}-{d[8:12]}-4{d[13:16]}-{'89'[d[16] in '01234']}{d[17:20]}-{d[20:32]}"
