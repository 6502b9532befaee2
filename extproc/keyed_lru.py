"""Items filed under keys, bounded in bytes and per key, least recently used first: the record store that the
hash cache (long prompts by their first chunk, ``kvcache/hash_cache.py``) and the encoder's checkpoints (long
texts by their first characters, ``prompt/checkpoints.py``) keep.

Shapes: ``_order = OrderedDict{item: (key, size)}``, least recently used first; ``_by_key = {key: [item, ...]}``,
most recently used first. Items are compared by identity (``eq=False`` dataclasses). Not thread-safe: callers
hold their own lock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V", bound=Hashable)


class KeyedLru(Generic[K, V]):
    """At most ``max_bytes`` of items in all and ``per_key`` under one key; the least recently used go first."""

    def __init__(self, max_bytes: int, per_key: int) -> None:
        self._max_bytes = max_bytes
        self._per_key = per_key
        self._order: OrderedDict[V, tuple[K, int]] = OrderedDict()
        self._by_key: dict[K, list[V]] = {}
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, item: object) -> bool:
        return item in self._order

    def under(self, key: K) -> Sequence[V]:
        """The items filed under ``key``, most recently used first (do not change it)."""
        return self._by_key.get(key, ())

    def used(self, item: V) -> None:
        """``item`` was just used: the most recent, overall and under its key."""
        key, _ = self._order[item]
        self._order.move_to_end(item)
        same_key = self._by_key[key]
        same_key.remove(item)
        same_key.insert(0, item)

    def add(self, key: K, item: V, size: int, *, replaces: V | None = None) -> bool:
        """File ``item`` under ``key`` as the most recently used (in place of ``replaces``, if filed), then evict
        beyond the bounds; False, and nothing changed, when ``item`` alone is over ``max_bytes``."""
        if size > self._max_bytes:
            return False
        if replaces is not None:
            self.discard(replaces)
        same_key = self._by_key.setdefault(key, [])
        same_key.insert(0, item)
        self._order[item] = (key, size)
        self.bytes += size
        if len(same_key) > self._per_key:
            self.discard(same_key[-1])
        while self.bytes > self._max_bytes:
            self.discard(next(iter(self._order)))
        return True

    def discard(self, item: V) -> None:
        """Forget ``item`` if it is filed."""
        filed = self._order.pop(item, None)
        if filed is None:
            return
        key, size = filed
        same_key = self._by_key[key]
        same_key.remove(item)
        if not same_key:
            del self._by_key[key]
        self.bytes -= size

    def clear(self) -> None:
        self._order.clear()
        self._by_key.clear()
        self.bytes = 0
