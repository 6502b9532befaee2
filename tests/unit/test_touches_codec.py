"""The touches' stream entry (``extproc.redis.touches``): what one replica writes (touches, predictions, due
calls), another reads back exactly."""

import pytest

from extproc.redis.touches import (
    SharedTouches,
    _Sinks,
    decode,
    decode_due_calls,
    decode_predictions,
    encode,
    encode_due_calls,
    encode_predictions,
)
from extproc.types import BlockHash, DueCall, EndpointId, Prediction, Touch

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


@pytest.mark.parametrize(
    "predictions",
    [
        [],
        [Prediction(EndpointId("10.0.0.1:8000"), 0.25)],  # no terms: nothing to learn from
        [
            Prediction(EndpointId("10.0.0.1:8000"), 0.1234567891234, (1.0, 0.05, 0.4, 0.03), 0.002),
            Prediction(EndpointId("pod-é.svc:80"), 3.5, (1.0, 2.0, 0.0, 1e-9), 0.0),
        ],
    ],
    ids=["none", "untermed", "mixed"],
)
def test_predictions_read_back_exactly(predictions: list[Prediction]) -> None:
    assert decode_predictions(encode_predictions(predictions)) == predictions


@pytest.mark.parametrize("cut", [1, 4, 10, 25, -1])
def test_a_cut_predictions_field_is_refused_not_misread(cut: int) -> None:
    payload = encode_predictions([Prediction(EndpointId("a:1"), 0.2, (1.0, 0.1, 0.0, 0.0), 0.01)])
    with pytest.raises(ValueError, match="malformed"):
        decode_predictions(payload[:cut])


def test_a_predictions_field_with_trailing_bytes_is_refused() -> None:
    with pytest.raises(ValueError, match="trailing"):
        decode_predictions(encode_predictions([]) + b"x")


def test_a_malformed_predictions_field_loses_its_predictions_not_the_entrys_touches() -> None:
    """An XREAD answer whose entry carries a good ``t`` and a cut ``p``: the touches are heard, the predictions
    counted as a read error, and the next entry's predictions still heard."""
    reader = SharedTouches(None, None, namespace="t", timeout_s=1.0, replica=b"reader00")  # type: ignore[arg-type]
    touch = Touch(EndpointId("a:1"), [BlockHash(1)], 1, 0)
    good = Prediction(EndpointId("a:1"), 0.2, (1.0, 0.1, 0.0, 0.0), 0.0)
    entries = [
        (b"1-0", {b"t": encode(REPLICA, [touch]), b"p": encode_predictions([good])[:-3]}),
        (b"2-0", {b"t": encode(REPLICA, []), b"p": encode_predictions([good])}),
    ]
    touches: list[Touch] = []
    predictions: list[Prediction] = []
    last = reader._deliver({b"t:touches": entries}, _Sinks(touches.append, predictions.append, None))
    assert (last, touches, predictions) == (b"2-0", [touch], [good])
    assert (reader.counters.read_errors, reader.counters.heard, reader.counters.predictions_heard) == (1, 1, 1)


@pytest.mark.parametrize(
    "calls",
    [
        [],
        [DueCall(EndpointId("10.0.0.1:8000"), BlockHash(2**64 - 1), 1, 0.0)],  # a first call: nothing measured
        [
            DueCall(EndpointId("10.0.0.1:8000"), BlockHash(7), 96, 0.1234567891234, 1.25, BlockHash(0)),
            DueCall(EndpointId("pod-é.svc:80"), BlockHash(8), 4000, 3.5, None, BlockHash(2**64 - 1)),
            DueCall(EndpointId("[fd00::1]:8000"), BlockHash(9), 2, 0.05, 0.0, None),
        ],
    ],
    ids=["none", "first", "mixed"],
)
def test_due_calls_read_back_exactly(calls: list[DueCall]) -> None:
    assert decode_due_calls(encode_due_calls(calls)) == calls


@pytest.mark.parametrize("cut", [1, 4, 10, 35, -1])
def test_a_cut_due_calls_field_is_refused_not_misread(cut: int) -> None:
    payload = encode_due_calls([DueCall(EndpointId("a:1"), BlockHash(3), 3, 0.2, 1.0, BlockHash(2))])
    with pytest.raises(ValueError, match="malformed"):
        decode_due_calls(payload[:cut])


def test_a_due_calls_field_with_trailing_bytes_is_refused() -> None:
    with pytest.raises(ValueError, match="trailing"):
        decode_due_calls(encode_due_calls([]) + b"x")


def test_due_calls_are_heard_from_others_and_a_malformed_field_loses_only_its_calls() -> None:
    """An XREAD answer with this replica's own entry (skipped whole), an entry whose ``d`` is cut (its touches
    heard, the calls counted as a read error) and a good one."""
    reader = SharedTouches(None, None, namespace="t", timeout_s=1.0, replica=b"reader00")  # type: ignore[arg-type]
    call = DueCall(EndpointId("a:1"), BlockHash(5), 5, 0.1, 0.9, BlockHash(3))
    touch = Touch(EndpointId("a:1"), [BlockHash(1)], 1, 0)
    entries = [
        (b"1-0", {b"t": encode(b"reader00", [touch]), b"d": encode_due_calls([call])}),
        (b"2-0", {b"t": encode(REPLICA, [touch]), b"d": encode_due_calls([call])[:-2]}),
        (b"3-0", {b"t": encode(REPLICA, []), b"d": encode_due_calls([call, call])}),
    ]
    touches: list[Touch] = []
    calls: list[DueCall] = []
    last = reader._deliver({b"t:touches": entries}, _Sinks(touches.append, None, calls.append))
    assert (last, touches, calls) == (b"3-0", [touch], [call, call])
    assert (reader.counters.read_errors, reader.counters.heard, reader.counters.due_calls_heard) == (1, 1, 2)
