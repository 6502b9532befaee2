"""vLLM's prefix-cache block hashing, implemented independently of the router.

Recipe (vLLM 0.29 – 0.33, ``vllm/v1/core/kv_cache_utils.py`` and ``vllm/utils/hashing.py``):

* ``H`` is ``sha256(pickle.dumps(obj, protocol=5))`` for ``sha256`` (the default) or
  ``sha256(cbor2.dumps(obj, canonical=True))`` for ``sha256_cbor``; both give 32-byte digests.
* ``NONE_HASH = H(seed)``, where ``seed`` is the string value of ``PYTHONHASHSEED`` when that variable is set,
  else the fixed string ``"vllm-none-hash"`` (the ≥ 0.29 rule for the sha256 family).
* Block ``i`` (full blocks only) hashes ``H((parent, tuple(tokens_i), extra_keys_i))`` with ``parent`` the
  previous
  block's digest (``NONE_HASH`` for block 0) and ``extra_keys_i`` a tuple or ``None``.
* Extra keys (≥ 0.31): ``("lora", name, path)`` on every block, then ``("cache_salt", salt)`` on block 0 only.
* Events carry the low 64 bits of a digest (last 8 bytes, big-endian) unless
  ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``, in which case they carry the raw digest.

This module deliberately shares no code with ``extproc``: the simulator exists to check the router independently.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, NewType

import cbor2

# A 32-byte digest as vLLM keeps it internally (``BlockHash = NewType("BlockHash", bytes)`` in vLLM).
BlockHash = NewType("BlockHash", bytes)
# What a KV event carries: the low 64 bits as an int (default) or the raw digest.
EventBlockHash = int | bytes

HashAlgo = Literal["sha256", "sha256_cbor"]
HASH_ALGOS: tuple[HashAlgo, ...] = ("sha256", "sha256_cbor")
DEFAULT_NONE_HASH_SEED = "vllm-none-hash"
_MASK64 = (1 << 64) - 1

# One block's extra keys: a tuple of tagged tuples, e.g. (("lora", "a", "/p"), ("cache_salt", "s")), or None.
ExtraKeys = tuple[tuple[str, ...], ...] | None
HashFn = Callable[[object], bytes]


def _sha256_pickle(obj: object) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def _sha256_cbor(obj: object) -> bytes:
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def hash_function(algo: HashAlgo) -> HashFn:
    """Return vLLM's hash function for ``--prefix-caching-hash-algo``; raises ValueError for others."""
    if algo == "sha256":
        return _sha256_pickle
    if algo == "sha256_cbor":
        return _sha256_cbor
    raise ValueError(f"unsupported prefix caching hash algorithm: {algo!r}")


def none_hash_seed(environ: Mapping[str, str]) -> str:
    """The NONE_HASH seed as vLLM ≥ 0.29 resolves it: ``PYTHONHASHSEED`` if set, else ``"vllm-none-hash"``."""
    seed = environ.get("PYTHONHASHSEED")
    return seed if seed is not None else DEFAULT_NONE_HASH_SEED


@dataclass(frozen=True, slots=True)
class LoraKey:
    """A LoRA adapter as it enters the hash: its served name, the path vLLM registered and its int id."""

    name: str
    path: str
    int_id: int


def block_extra_keys(block_index: int, lora: LoraKey | None, cache_salt: str | None) -> ExtraKeys:
    """Extra keys of block ``block_index`` in vLLM ≥ 0.31 order: LoRA (every block), then salt (block 0)."""
    keys: list[tuple[str, ...]] = []
    if lora is not None:
        keys.append(("lora", lora.name, lora.path))
    if cache_salt and block_index == 0:
        keys.append(("cache_salt", cache_salt))
    return tuple(keys) if keys else None


def event_extra_keys(keys: ExtraKeys) -> tuple[str, ...] | None:
    """The untagged form events carry: each entry loses its tag; a LoRA entry keeps only its name."""
    if keys is None:
        return None
    return tuple(entry[1] for entry in keys)


class BlockHasher:
    """Chained block hashing for one engine (one algorithm, one seed, one block size).

    Built once per engine, like vLLM's ``init_none_hash`` + ``get_request_block_hasher``; holds no global state.
    """

    def __init__(self, algo: HashAlgo, seed: str, block_size: int) -> None:
        if block_size <= 0:
            raise ValueError("block_size must be positive")
        self.algo = algo
        self.block_size = block_size
        self._hash = hash_function(algo)
        self.none_hash = BlockHash(self._hash(seed))

    def hash_block(self, parent: BlockHash | None, tokens: Sequence[int], extra: ExtraKeys) -> BlockHash:
        """``H((parent or NONE_HASH, tuple(tokens), extra))`` exactly as vLLM's ``hash_block_tokens``."""
        return BlockHash(self._hash((parent or self.none_hash, tuple(tokens), extra)))

    def extend(
        self,
        hashes: list[BlockHash],
        token_ids: Sequence[int],
        lora: LoraKey | None,
        cache_salt: str | None,
    ) -> None:
        """Append to ``hashes`` the digests of every full block of ``token_ids`` not hashed yet (in place).

        ``hashes`` must hold the digests of the first ``len(hashes)`` blocks of ``token_ids``.
        """
        bs = self.block_size
        parent = hashes[-1] if hashes else None
        for index in range(len(hashes), len(token_ids) // bs):
            block = token_ids[index * bs : (index + 1) * bs]
            parent = self.hash_block(parent, block, block_extra_keys(index, lora, cache_salt))
            hashes.append(parent)

    def hash_tokens(
        self, token_ids: Sequence[int], lora: LoraKey | None = None, cache_salt: str | None = None
    ) -> list[BlockHash]:
        """Digests of all full blocks of ``token_ids``."""
        out: list[BlockHash] = []
        self.extend(out, token_ids, lora, cache_salt)
        return out


def to_event_hash(digest: BlockHash, use_int: bool) -> EventBlockHash:
    """vLLM's ``maybe_convert_block_hash``: low 64 bits as an unsigned int, or the raw bytes."""
    if use_int:
        return int.from_bytes(digest, "big") & _MASK64
    return bytes(digest)
