"""vLLM-identical prefix-block hashing: the keys the router computes from a request's token ids.

Recipe (vLLM 0.33.0 ``vllm/v1/core/kv_cache_utils.py``: ``init_none_hash``, ``hash_block_tokens``,
``get_request_block_hasher``, ``generate_block_hash_extra_keys``; ``vllm/utils/hashing.py``)::

    NONE_HASH = H(seed)            # seed: PYTHONHASHSEED string if set, else "vllm-none-hash"
    h_{-1}    = NONE_HASH
    h_i       = H((h_{i-1}, tuple(block_i_tokens), extra_keys_i or None))     # full blocks only
    extra_keys_i = (("lora", name, path),)  if LoRA            # every block
                 + (("cache_salt", salt),)  if salt and i == 0 # first block only
    event int = int.from_bytes(h_i, "big") & (2**64 - 1)      # low 64 bits, what BlockStored carries

``H`` is ``sha256``: SHA-256 of ``pickle.dumps(obj, protocol=5)``, or ``sha256_cbor``: SHA-256 of
``cbor2.dumps(obj, canonical=True)``. Other algorithms (``xxhash*``, 0.10's ``builtin``) are rejected.

Matches vLLM **>= 0.31** exactly (tagged extra keys, LoRA path in the key). The seed rule is that of
**>= 0.29**; vLLM 0.11-0.28 match only when ``PYTHONHASHSEED`` is set on every engine and configured here, and
only for requests without LoRA or ``cache_salt`` (those releases used untagged extra keys). Verified against
``../shared/vllm/golden-hashes.json`` (values from vLLM 0.33.0's own code) by
``tests/unit/test_hashing_golden.py``.

Token ids must be plain Python ``int`` (not ``bool``, not numpy integers): pickle and CBOR encode other types
differently, silently giving keys that never match an engine's.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable, Sequence
from typing import NewType, cast

import cbor2

from extproc.types import BlockHash, HashScheme, LoraAdapter

BlockDigest = NewType("BlockDigest", bytes)
"""vLLM's full 32-byte chained block digest (what the engine keys its prefix cache by, before the 64-bit cut).

Kept apart from ``BlockHash`` (the 64-bit event form everything else uses) so the two never mix silently.
"""

DEFAULT_NONE_HASH_SEED = "vllm-none-hash"
"""vLLM >= 0.29's seed for ``sha256``/``sha256_cbor`` when ``PYTHONHASHSEED`` is unset."""

SUPPORTED_ALGOS = ("sha256", "sha256_cbor")

_MASK64 = (1 << 64) - 1
_PICKLE_PROTOCOL = 5  # pickle.HIGHEST_PROTOCOL on CPython 3.8-3.14, which is what vLLM uses
_MEMO_LIMIT = 1 << 20  # distinct token ids whose CBOR encoding one hasher remembers (~60 MB worst case)

ExtraKeys = tuple[tuple[str, ...], ...] | None
"""A block's extra keys as vLLM hashes them: ``(("lora", name, path), ("cache_salt", salt))`` or ``None``."""


class Unhashable(ValueError):
    """No block keys exist for this request under the scheme: ``sha256_cbor`` cannot encode its extra keys (a
    ``cache_salt`` holding a lone surrogate, JSON ``"\\ud800"``), and vLLM cannot hash it either."""


def to_event_int(digest: bytes) -> int:
    """The block hash as vLLM's KV events carry it: the digest's low 64 bits (last 8 bytes, big-endian)."""
    return int.from_bytes(digest[-8:], "big")


def _cbor_head(major: int, value: int) -> bytes:
    """A canonical (shortest) CBOR head for ``major`` type and non-negative ``value`` < 2**64."""
    top = major << 5
    if value < 24:
        return bytes((top | value,))
    if value < 1 << 8:
        return bytes((top | 24, value))
    if value < 1 << 16:
        return bytes((top | 25,)) + value.to_bytes(2, "big")
    if value < 1 << 32:
        return bytes((top | 26,)) + value.to_bytes(4, "big")
    return bytes((top | 27,)) + value.to_bytes(8, "big")


def cbor_int(value: int) -> bytes:
    """Canonical CBOR of one token id, byte-identical to ``cbor2.dumps(value, canonical=True)``."""
    if type(value) is int and 0 <= value <= _MASK64:
        return _cbor_head(0, value)
    if type(value) is int and -(1 << 64) <= value < 0:
        return _cbor_head(1, -1 - value)
    return cbor2.dumps(value, canonical=True)  # bignums and anything odd: let cbor2 decide


def cbor_block(parent: bytes, encoded_tokens: Sequence[bytes], extra: bytes) -> bytes:
    """Canonical CBOR of ``(parent, tuple(tokens), extra_keys)`` from pre-encoded parts.

    ``encoded_tokens`` are ``cbor_int`` outputs; ``extra`` is the CBOR of the extra keys
    (``b"\\xf6"`` for None).
    Equal to ``cbor2.dumps((parent, tuple(tokens), extra_keys), canonical=True)`` (hypothesis-tested).
    """
    return b"".join(
        (
            b"\x83",
            _cbor_head(2, len(parent)),
            parent,
            _cbor_head(4, len(encoded_tokens)),
            *encoded_tokens,
            extra,
        )
    )


def _sha256_pickle(obj: object) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=_PICKLE_PROTOCOL)).digest()


def _sha256_cbor(obj: object) -> bytes:
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def extra_keys_for(lora: LoraAdapter | None, cache_salt: str | None) -> tuple[ExtraKeys, ExtraKeys]:
    """The extra keys of block 0 and of every later block, as vLLM >= 0.31 builds them.

    An empty ``cache_salt`` counts as none (vLLM tests the salt for truthiness).
    """
    lora_keys: tuple[tuple[str, ...], ...] = (("lora", lora.name, lora.path),) if lora else ()
    first = lora_keys + ((("cache_salt", cache_salt),) if cache_salt else ())
    return first or None, lora_keys or None


class BlockHasher:
    """Computes one model pool's prefix-block keys; stateless apart from a token-encoding memo.

    Built once per ``HashScheme`` by the composition root and shared by every request; thread-safe (the memo
    only ever gains entries whose value is a pure function of the key).
    """

    def __init__(self, scheme: HashScheme) -> None:
        """Raises ``ValueError`` for an algorithm other than sha256/sha256_cbor or a block size < 1."""
        if scheme.algo not in SUPPORTED_ALGOS:
            raise ValueError(f"unsupported prefix hash algo {scheme.algo!r}; use one of {SUPPORTED_ALGOS}")
        if scheme.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {scheme.block_size}")
        self.scheme = scheme
        self._cbor = scheme.algo == "sha256_cbor"
        self._hash: Callable[[object], bytes] = _sha256_cbor if self._cbor else _sha256_pickle
        seed = scheme.seed if scheme.seed is not None else DEFAULT_NONE_HASH_SEED
        self._none_hash = self._hash(seed)
        self._memo: dict[int, bytes] = {}  # {token_id: canonical CBOR of it}

    def none_hash(self) -> bytes:
        """``NONE_HASH`` for this scheme: ``H(seed)``, the parent of every request's first block."""
        return self._none_hash

    def hash_blocks(
        self,
        token_ids: Sequence[int],
        *,
        lora: LoraAdapter | None = None,
        cache_salt: str | None = None,
        max_blocks: int | None = None,
    ) -> list[BlockHash]:
        """The event-form keys (low 64 bits) of every full block of ``token_ids``, in order.

        Called on the read path once per request, off the event loop for long prompts. ``max_blocks`` caps
        the work (the first ``max_blocks`` blocks). A partial tail block is not hashed, as in vLLM.
        """
        digests = self.hash_digests(token_ids, lora=lora, cache_salt=cache_salt, max_blocks=max_blocks)
        return [BlockHash(int.from_bytes(d[-8:], "big")) for d in digests]  # to_event_int, inlined

    def hash_digests(
        self,
        token_ids: Sequence[int],
        *,
        lora: LoraAdapter | None = None,
        cache_salt: str | None = None,
        max_blocks: int | None = None,
    ) -> list[BlockDigest]:
        """The full 32-byte chained digests of every full block; same contract as ``hash_blocks``."""
        size = self.scheme.block_size
        count = len(token_ids) // size
        if max_blocks is not None:
            count = max(0, min(count, max_blocks))
        return self.hash_digests_from(token_ids[: count * size], parent=None, lora=lora, cache_salt=cache_salt)

    def hash_digests_from(
        self,
        token_ids: Sequence[int],
        *,
        parent: bytes | None,
        lora: LoraAdapter | None = None,
        cache_salt: str | None = None,
        first_block: bool = True,
    ) -> list[BlockDigest]:
        """Digests of the full blocks of ``token_ids``, chained on from ``parent`` (None: ``NONE_HASH``).

        ``first_block``: ``token_ids`` start at the prompt's block 0 (which carries the salt); else they
        continue a prompt whose earlier blocks ended in ``parent`` (the prefix cache resumes this way).
        Raises ``Unhashable`` when the scheme cannot encode the extra keys (as vLLM cannot).
        """
        size = self.scheme.block_size
        count = len(token_ids) // size
        if count == 0:
            return []
        first, rest = extra_keys_for(lora, cache_salt)
        if not first_block:
            first = rest
        tokens = token_ids if len(token_ids) == count * size else token_ids[: count * size]
        start = parent if parent is not None else self._none_hash
        if self._cbor:
            return self._chain_cbor(tokens, size, first, rest, start)
        return self._chain_pickle(tokens, size, first, rest, start)

    def _chain_pickle(
        self, tokens: Sequence[int], size: int, first: ExtraKeys, rest: ExtraKeys, parent: bytes
    ) -> list[BlockDigest]:
        sha, dumps = hashlib.sha256, pickle.dumps
        out: list[bytes] = []
        for start in range(0, len(tokens), size):
            extra = first if start == 0 else rest
            block = (parent, tuple(tokens[start : start + size]), extra)
            parent = sha(dumps(block, protocol=_PICKLE_PROTOCOL)).digest()
            out.append(parent)
        return cast(list[BlockDigest], out)  # NewType without a per-block call

    def _chain_cbor(
        self, tokens: Sequence[int], size: int, first: ExtraKeys, rest: ExtraKeys, parent: bytes
    ) -> list[BlockDigest]:
        # Each token's CBOR is looked up once (memoized per hasher), then every block is one join and one
        # SHA-256: about 2x faster than cbor2.dumps per block.
        encoded = self._encode_tokens(tokens)
        try:
            extra_first = cbor2.dumps(first, canonical=True)
            extra_rest = cbor2.dumps(rest, canonical=True)
        except UnicodeEncodeError as exc:
            raise Unhashable(f"sha256_cbor cannot encode the extra keys: {exc}") from exc
        sha, join = hashlib.sha256, b"".join
        prefix = b"\x83" + _cbor_head(2, len(self._none_hash))  # parents are always 32-byte digests
        array_head = _cbor_head(4, size)
        out: list[bytes] = []
        for start in range(0, len(encoded), size):
            extra = extra_first if start == 0 else extra_rest
            parent = sha(join((prefix, parent, array_head, *encoded[start : start + size], extra))).digest()
            out.append(parent)
        return cast(list[BlockDigest], out)  # NewType without a per-block call

    def _encode_tokens(self, tokens: Sequence[int]) -> list[bytes]:
        """Canonical CBOR of each token id, through the memo (plain ints only; see the module docstring)."""
        memo = self._memo
        try:
            return list(map(memo.__getitem__, tokens))
        except KeyError:
            pass
        out: list[bytes] = []
        for token in tokens:
            enc = memo.get(token)
            if enc is None or type(token) is not int:  # a bool equals 1 but must not share its encoding
                enc = cbor_int(token)
                if type(token) is int and len(memo) < _MEMO_LIMIT:
                    memo[token] = enc
            out.append(enc)
        return out
