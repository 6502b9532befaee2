"""KeyedLru: the least recently used go first, within a byte budget and a count per key."""

from __future__ import annotations

from extproc.keyed_lru import KeyedLru


class Item:
    """An identity-compared item, as the stores file them."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


def test_least_recently_used_first_and_a_use_counts() -> None:
    lru: KeyedLru[str, Item] = KeyedLru(max_bytes=30, per_key=8)
    a, b, c, d = Item("a"), Item("b"), Item("c"), Item("d")
    for key, item in (("k", a), ("k", b), ("j", c)):
        assert lru.add(key, item, 10)
    lru.used(a)
    assert list(lru.under("k")) == [a, b]
    lru.add("j", d, 10)  # 40 bytes for 30: b, the least recently used, goes
    assert b not in lru and list(lru.under("k")) == [a] and list(lru.under("j")) == [d, c]
    assert (lru.bytes, len(lru)) == (30, 3)


def test_the_count_per_key_and_a_replacement() -> None:
    lru: KeyedLru[str, Item] = KeyedLru(max_bytes=1000, per_key=2)
    old, new, newer = Item("old"), Item("new"), Item("newer")
    lru.add("k", old, 1)
    lru.add("k", new, 1)
    lru.add("k", newer, 1)  # a third under one key: its least recently used goes
    assert list(lru.under("k")) == [newer, new]
    grown = Item("grown")
    assert lru.add("k", grown, 1, replaces=newer)
    assert list(lru.under("k")) == [grown, new] and lru.bytes == 2


def test_an_item_over_the_budget_changes_nothing() -> None:
    lru: KeyedLru[str, Item] = KeyedLru(max_bytes=10, per_key=4)
    kept = Item("kept")
    lru.add("k", kept, 5)
    assert not lru.add("k", Item("huge"), 11, replaces=kept)
    assert list(lru.under("k")) == [kept] and lru.bytes == 5
    lru.discard(kept)
    lru.discard(kept)
    assert (len(lru), lru.bytes, list(lru.under("k"))) == (0, 0, [])
