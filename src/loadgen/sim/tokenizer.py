"""A deterministic stand-in tokenizer, and the text the simulated model "generates".

Tokenizing cuts the text into pieces, each one token, the way a BPE vocabulary treats English:
    a word of up to 8 letters, with one leading space      (" experts")
    longer words: one piece per 8 letters                   (" internat", "ionaliza", "tion")
    up to 3 digits                                          (" 202", "6")
    a run of punctuation, an underscore run, a whitespace run
So "Hello there" is 2 tokens and English prose about 4.5 characters per token. The pieces cover the
text exactly, so two texts that share a prefix share a token prefix, which prompt caching relies on.

A piece's id is crc32(piece) mod the ordinary vocabulary, the same in every process; ids from
N_VOCAB_ORDINARY upwards are left for special tokens, as in Qwen's vocabulary.
"""

from __future__ import annotations

import random
import re
import zlib

N_VOCAB = 151_936
N_VOCAB_ORDINARY = 151_643
EOS_TOKEN = 151_645  # <|im_end|>
EOS_TEXT = "<|im_end|>"

_PIECE = re.compile(r" ?[^\W\d_]{1,8}| ?\d{1,3}| ?[^\w\s]+| ?_+|\s+")

# Generated text: whole words, each one token with its leading space, and "." as a token.
_WORDS = (
    " the", " of", " and", " to", " in", " is", " that", " for", " it", " as", " with", " on", " by",
    " this", " are", " be", " at", " from", " or", " an", " each", " one", " all", " more", " can",
    " its", " only", " when", " than", " then", " two", " so", " also", " into", " over", " most",
    " mixture", " experts", " routing", " router", " gate", " top", " load", " slot", " batch", " step",
    " tokens", " layer", " shared", " active", " weights", " memory", " cache", " decode", " prefill",
)
_CAPITALS = (" The", " Each", " This", " When", " Only", " Most", " All")


def pieces(text: str) -> list[str]:
    return _PIECE.findall(text)


def token_id(piece: str) -> int:
    return zlib.crc32(piece.encode("utf-8")) % N_VOCAB_ORDINARY


def tokenize(text: str) -> list[int]:
    return [token_id(piece) for piece in pieces(text)]


class TextSource:
    """Seeded generated text: sentences of short words, one token per call to `next_piece`."""

    def __init__(self, rng: random.Random):
        self._rng = rng
        self._words_left = 0

    def next_piece(self) -> tuple[int, str]:
        """The next (token id, text) of a sentence of 6 to 14 words ended by a period."""
        if self._words_left == 0:
            self._words_left = self._rng.randint(6, 14)
            piece = self._rng.choice(_CAPITALS)
        elif self._words_left == 1:
            piece = "."
        else:
            piece = self._rng.choice(_WORDS)
        self._words_left -= 1
        return token_id(piece), piece
