"""The touches' stream entry (``extproc.redis.touches``): what one replica writes, another reads back exactly."""

import pytest

from extproc.redis.touches import decode, encode
from extproc.types import BlockHash, EndpointId, Touch

REPLICA = b"replica1"


@pytest.mark.parametrize(
    "touches",
    [
        [],
        [Touch(EndpointId("10.0.0.1:8000"), [], 0, 3)],  # a cold request that stored only
        [
            Touch(EndpointId("10.0.0.1:8000"), [BlockHash(0), BlockHash(2**64 - 1), BlockHash(12345)], 2, 7),
            Touch(EndpointId("[fd00::1]:8000"), [BlockHash(h) for h in range(5000)], 5000, 0),  # a long context
            Touch(EndpointId("pod-é.svc:80"), [BlockHash(9)], 0, 1),
        ],
    ],
    ids=["none", "stored-only", "mixed"],
)
def test_an_entry_reads_back_as_written(touches: list[Touch]) -> None:
    replica, got = decode(encode(REPLICA, touches))
    assert replica == REPLICA
    assert [(t.endpoint, list(t.path), t.hit_blocks, t.stored_blocks) for t in got] == [
        (t.endpoint, list(t.path), t.hit_blocks, t.stored_blocks) for t in touches
    ]


@pytest.mark.parametrize("cut", [1, 8, 13, 20, -1])
def test_a_cut_entry_is_refused_not_misread(cut: int) -> None:
    payload = encode(REPLICA, [Touch(EndpointId("a:1"), [BlockHash(1), BlockHash(2)], 1, 1)])
    with pytest.raises(ValueError, match="malformed"):
        decode(payload[:cut])


def test_trailing_bytes_are_refused() -> None:
    with pytest.raises(ValueError, match="trailing"):
        decode(encode(REPLICA, []) + b"x")
