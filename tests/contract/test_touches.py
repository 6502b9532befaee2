"""The replicas' touches (``extproc.redis.touches.SharedTouches``) against Valkey, Redis 7 and a Valkey cluster:
what one replica publishes (touches, TTFT predictions, due calls), every other replica hears, in order, once;
nobody hears its own; a replica hears what was published after it started following."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable

import pytest

from extproc.redis.touches import SharedTouches
from extproc.types import BlockHash, DueCall, EndpointId, Prediction, Touch
from tests.support.polling import until

pytestmark = pytest.mark.redis

A, B = EndpointId("10.0.0.1:8000"), EndpointId("10.0.0.2:8000")


def touch(endpoint: EndpointId, n: int, hit: int) -> Touch:
    return Touch(endpoint, [BlockHash(1000 * n + i) for i in range(n)], hit, n - hit + 2)


@pytest.fixture(params=["redis", "redis7", "redis-cluster"])
async def replicas(request: pytest.FixtureRequest) -> AsyncIterator[Callable[[], SharedTouches]]:
    fixture = {"redis": "valkey_url", "redis7": "redis7_url", "redis-cluster": "valkey_cluster"}[request.param]
    server = request.getfixturevalue(fixture)
    url = server if isinstance(server, str) else server.url
    ns, made = f"touch{uuid.uuid4().hex[:10]}", list[SharedTouches]()

    def make() -> SharedTouches:
        # timeouts for a busy 2-core CI box: the contract is what it answers, not how fast
        made.append(SharedTouches.from_url(url, namespace=ns, timeout_s=5.0, block_s=0.2))
        return made[-1]

    try:
        yield make
    finally:
        for t in made:
            await t.close()


def as_tuples(touches: list[Touch]) -> list[tuple[EndpointId, list[BlockHash], int, int]]:
    return [(t.endpoint, list(t.path), t.hit_blocks, t.stored_blocks) for t in touches]


async def following(replica: SharedTouches, sink: Callable[[Touch], None]) -> None:
    """Start following and wait until the reader knows where it starts (after the newest entry)."""
    replica.follow(sink)
    await until(replica.positioned.is_set, what="the reader's position")


async def test_every_other_replica_hears_each_touch_once_in_order(replicas: Callable[[], SharedTouches]) -> None:
    x, y, z = replicas(), replicas(), replicas()
    heard: dict[str, list[Touch]] = {"x": [], "y": [], "z": []}
    for name, replica in (("x", x), ("y", y), ("z", z)):
        await following(replica, heard[name].append)
    sent = [touch(A, 3, 3), touch(B, 40, 0), touch(A, 1, 0)]
    for t in sent[:2]:
        x.publish(t)  # one event-loop turn: one entry
    await asyncio.sleep(0.05)
    x.publish(sent[2])
    await until(lambda: len(heard["y"]) == 3 and len(heard["z"]) == 3, what="y and z hearing 3")
    assert as_tuples(heard["y"]) == as_tuples(heard["z"]) == as_tuples(sent)
    assert heard["x"] == [], "a replica does not hear its own touches"
    assert (x.counters.published, y.counters.heard, z.counters.heard, x.counters.lost) == (3, 3, 3, 0)


async def test_a_replica_hears_what_was_published_after_it_began_following(
    replicas: Callable[[], SharedTouches],
) -> None:
    x, late = replicas(), replicas()
    x.publish(touch(A, 2, 1))
    await until(lambda: x.counters.published == 1, what="the first touch published")
    heard: list[Touch] = []
    await following(late, heard.append)
    x.publish(touch(B, 5, 5))
    await until(lambda: len(heard) == 1, what="the touch published after following")
    await asyncio.sleep(0.3)  # anything else would have arrived by now (an earlier entry would be read first)
    assert as_tuples(heard) == as_tuples([touch(B, 5, 5)])


async def test_a_reader_that_fails_says_so_at_once(
    replicas: Callable[[], SharedTouches], caplog: pytest.LogCaptureFixture
) -> None:
    x, broken = replicas(), replicas()

    def sink(_: Touch) -> None:
        raise RuntimeError("a bug in the sink")

    await following(broken, sink)
    x.publish(touch(A, 2, 2))
    await until(lambda: "no longer read" in caplog.text, what="the reader's failure logged")


async def test_predictions_ride_with_the_touches_and_are_heard_in_order(
    replicas: Callable[[], SharedTouches],
) -> None:
    """A replica that follows only predictions (hot sets not shared) hears every other replica's, in the order
    they were published, with their terms; a replica following only touches hears the touches of the same
    entries, and predictions sent without touches reach the prediction follower alone."""
    x, y, z = replicas(), replicas(), replicas()
    predicted: list[Prediction] = []
    touched: list[Touch] = []
    y.follow(None, predicted.append)
    z.follow(touched.append)
    await until(lambda: y.positioned.is_set() and z.positioned.is_set(), what="the readers' positions")
    sent = [Prediction(A, 0.31, (1.0, 0.2, 0.6, 0.01), 0.004), Prediction(B, 0.05), Prediction(A, 1.5, (1.0,) * 4)]
    x.publish(touch(A, 2, 2))
    x.publish_prediction(sent[0])  # one event-loop turn: one entry with both fields
    await asyncio.sleep(0.05)
    x.publish_prediction(sent[1])  # an entry with predictions only
    x.publish_prediction(sent[2])
    await until(lambda: len(predicted) == 3, what="y hearing 3 predictions")
    await asyncio.sleep(0.3)  # anything else would have arrived by now
    assert predicted == sent
    assert as_tuples(touched) == as_tuples([touch(A, 2, 2)])
    assert (x.counters.predictions_published, y.counters.predictions_heard, y.counters.heard) == (3, 3, 0)
    assert (z.counters.heard, z.counters.predictions_heard, z.counters.read_errors) == (1, 0, 0)


async def test_due_calls_ride_with_the_touches_and_are_heard_in_order(
    replicas: Callable[[], SharedTouches],
) -> None:
    """A replica that follows only due calls hears every other replica's in order, beside the predictions of the
    same entry; one that follows only predictions does not get them."""
    x, y, z = replicas(), replicas(), replicas()
    due: list[DueCall] = []
    predicted: list[Prediction] = []
    y.follow(None, None, due.append)
    z.follow(None, predicted.append)
    await until(lambda: y.positioned.is_set() and z.positioned.is_set(), what="the readers' positions")
    sent = [DueCall(A, BlockHash(5), 5, 0.12, None, None), DueCall(B, BlockHash(9), 9, 0.3, 1.1, BlockHash(5))]
    x.publish_due_call(sent[0])
    x.publish_prediction(Prediction(A, 0.12))  # the same entry
    await asyncio.sleep(0.05)
    x.publish_due_call(sent[1])  # an entry with a due call only
    await until(lambda: len(due) == 2 and len(predicted) == 1, what="y hearing 2 due calls, z 1 prediction")
    await asyncio.sleep(0.3)  # anything else would have arrived by now
    assert due == sent
    assert (x.counters.due_calls_published, y.counters.due_calls_heard, z.counters.due_calls_heard) == (2, 2, 0)
    assert (y.counters.predictions_heard, y.counters.read_errors, z.counters.read_errors) == (0, 0, 0)
