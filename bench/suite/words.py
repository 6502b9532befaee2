"""Token-exact synthetic text: every word is one Qwen3 token, so a prompt of N words is N prompt tokens.

The vocabulary is every token of the served model's tokenizer that decodes to a space followed by 3–9 ASCII
lowercase letters (about 20k words), sorted, so it is the same on every machine. Such words are their own
pre-tokens (the byte-level BPE splits on the leading space), so any concatenation tokenizes to exactly one
token per word, block edges included; ``tests/bench/test_suite.py`` checks the round trip.

A prompt is a tuple of word ids. ``SPACE`` (-1) stands for one extra leading space before the next word: it
becomes its own token (" " then " word"), which shifts every later block: the "one leading space" variant.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from pathlib import Path

from bench.stack_config import MODEL, TOKENIZER_CACHE

SPACE = -1
_WORD = re.compile(r" [a-z]{3,9}")


@functools.cache
def vocabulary(tokenizer_dir: str = str(TOKENIZER_CACHE / MODEL)) -> tuple[str, ...]:
    """The sorted single-token words of the tokenizer in ``tokenizer_dir`` (read from its ``vocab.json``)."""
    vocab: dict[str, int] = json.loads((Path(tokenizer_dir) / "vocab.json").read_text())
    # byte-level BPE spells a leading space as "Ġ"; the rest must be plain lowercase letters
    words = {" " + tok[1:] for tok in vocab if tok.startswith("Ġ") and _WORD.fullmatch(" " + tok[1:])}
    return tuple(sorted(words))


def render(ids: Sequence[int]) -> str:
    """The text of a prompt (word ids; ``SPACE`` = one extra space)."""
    words = vocabulary()
    return "".join(" " if i == SPACE else words[i] for i in ids)
