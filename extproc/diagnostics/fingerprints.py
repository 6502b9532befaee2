"""Unchained content fingerprints of a prompt, per granule of a few tokens, cut at any token offset.

vLLM's block hashes are chained: a change in block k changes every later hash, so they cannot show that the
content after a varying span repeats. These fingerprints are not chained: granule ``i`` cut at ``start`` is a
64-bit function of ``tokens[start + i*G : start + (i+1)*G]`` alone, so re-cutting after a span re-aligns.

Recipe (vectorised, no per-token Python loop): each token is mixed with a per-process key through the
splitmix64 finalizer; a granule is the wrapping (mod 2**64) dot product of its G mixed tokens with G odd
key-derived weights. Equal tokens give equal fingerprints; a different key gives unrelated ones, so a stored
fingerprint says nothing about the text to anyone without the process's key. Not a cryptographic hash: it is
for counting repeats, never for cache keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

Fingerprints = npt.NDArray[np.uint64]
"""One uint64 per granule, in prompt order."""

_C1, _C2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_EMPTY: Fingerprints = np.zeros(0, dtype=np.uint64)


def _mix(x: Fingerprints) -> Fingerprints:
    """splitmix64's finalizer, element-wise (uint64 arithmetic wraps)."""
    x = x ^ (x >> _S30)
    x = x * _C1
    x = x ^ (x >> _S27)
    x = x * _C2
    return x ^ (x >> _S31)


class PromptView(Protocol):
    """What the detector reads of one prompt: its length and its granules, cut where it asks."""

    @property
    def granule_tokens(self) -> int: ...

    @property
    def tokens(self) -> int: ...

    def granules(self, start: int, count: int | None = None) -> Fingerprints | None:
        """Fingerprints of the whole granules from token ``start`` on (at most ``count``); empty past the end;
        None when this view cannot be cut at ``start`` (a trace knows only its own blocks)."""
        ...


class Fingerprinter:
    """Makes ``TokenView`` s with one key and granule size; one per process (the key is the privacy)."""

    def __init__(self, granule_tokens: int, key: int) -> None:
        if granule_tokens < 1:
            raise ValueError("granule_tokens must be >= 1")
        self.granule_tokens = granule_tokens
        self._key = np.uint64(key & 0xFFFFFFFFFFFFFFFF)
        rng = np.random.default_rng(key & 0xFFFFFFFFFFFFFFFF)
        self._weights = rng.integers(0, 2**63, size=granule_tokens, dtype=np.uint64) * np.uint64(2) + np.uint64(1)

    def view(self, token_ids: Sequence[int]) -> TokenView:
        """A prompt's view (one array conversion and one mixing pass, ~10 ns per token)."""
        mixed = _mix(np.asarray(token_ids, dtype=np.uint64) ^ self._key)
        return TokenView(mixed, self._weights)


class TokenView:
    """A tokenized prompt: granules can be cut at any token offset (see the module docstring)."""

    def __init__(self, mixed: Fingerprints, weights: Fingerprints) -> None:
        self._mixed = mixed  # [token] -> mixed token
        self._weights = weights

    @property
    def granule_tokens(self) -> int:
        return int(self._weights.size)

    @property
    def tokens(self) -> int:
        return int(self._mixed.size)

    def granules(self, start: int, count: int | None = None) -> Fingerprints | None:
        if start < 0:
            return None
        g = self._weights.size
        n = max((self._mixed.size - start) // g, 0)
        n = n if count is None else min(n, count)
        if n == 0:
            return _EMPTY
        cut = self._mixed[start : start + n * g].reshape(n, g)
        out: Fingerprints = cut @ self._weights  # wraps mod 2**64, like the sum of products
        return out


class BlockIdView:
    """A trace's request (Mooncake ``hash_ids``): one id per block of ``block_tokens``, cut only at block edges.

    Trace ids are usually chained (a block's id depends on its prefix), so the detector finds no re-aligning
    content in them: a trace is a "no varying span" input unless its ids were made per block content.
    """

    def __init__(self, block_ids: Sequence[int], block_tokens: int, key: int = 0) -> None:
        ids = np.asarray(block_ids, dtype=np.uint64) ^ np.uint64(key & 0xFFFFFFFFFFFFFFFF)
        self._ids = _mix(ids)
        self._block = block_tokens

    @property
    def granule_tokens(self) -> int:
        return self._block

    @property
    def tokens(self) -> int:
        return int(self._ids.size) * self._block

    def granules(self, start: int, count: int | None = None) -> Fingerprints | None:
        if start < 0 or start % self._block:
            return None
        first = start // self._block
        return self._ids[first : None if count is None else first + count]
