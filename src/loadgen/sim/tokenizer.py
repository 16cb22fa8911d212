"""A deterministic stand-in tokenizer, and the text the simulated model "generates".

Tokenizing: the text is cut into pieces matching `\\s*\\S{1,4}` (leading whitespace plus up to four
non-space characters), with trailing whitespace as a last piece. So a short word with its leading
space is one token and a long word is one token per four characters: English prose comes out near
3.5 characters per token, close to a real BPE vocabulary. The pieces cover the text exactly, so two
texts that share a prefix share a token prefix, which is what prompt caching depends on.

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

_PIECE = re.compile(r"\s*\S{1,4}|\s+")

# Generated text: short words, each one token with its leading space, and punctuation as tokens.
_WORDS = (
    " the", " of", " and", " to", " in", " is", " that", " for", " it", " as", " with", " on", " by",
    " this", " are", " be", " at", " from", " or", " an", " each", " one", " all", " more", " can",
    " its", " only", " when", " than", " then", " two", " so", " also", " into", " over", " most",
    " mix", " of", " expe", "rts", " rout", "ing", " gate", " top", " load", " slot", " batch", " step",
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
