"""The replay helpers' pure part: which replayed batches may be applied."""

from __future__ import annotations

import pytest

from extproc.kvcache.events import ReplayItem
from extproc.kvcache.replay import contiguous_tail


def items(*seqs: int) -> list[ReplayItem]:
    return [ReplayItem(seq=s, payload=b"p", topic=None) for s in seqs]


@pytest.mark.parametrize(
    ("seqs", "until", "expected"),
    [
        pytest.param((), None, (), id="empty"),
        pytest.param((0, 1, 2), None, (0, 1, 2), id="whole-history"),
        pytest.param((5, 6, 8, 9), None, (8, 9), id="hole-keeps-the-tail"),
        pytest.param((3, 4, 5, 6, 7), 6, (3, 4, 5), id="gap-filled-items-past-until-dropped"),
        pytest.param((4, 5), 6, (4, 5), id="gap-partly-filled"),
        pytest.param((3, 5), 6, (5,), id="gap-with-a-hole"),
        pytest.param((3, 4), 6, (), id="does-not-reach-until"),
        pytest.param((7, 8), 6, (), id="all-past-until"),
    ],
)
def test_contiguous_tail(seqs: tuple[int, ...], until: int | None, expected: tuple[int, ...]) -> None:
    assert tuple(i.seq for i in contiguous_tail(items(*seqs), until)) == expected
