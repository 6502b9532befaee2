"""``DueCalls``: where and when each recent request's next call is expected (the time from a call's predicted
first token to the call that continues it, measured); ``collision_s``: what a request placed before such a call
costs it."""

from dataclasses import replace

import pytest

from extproc.scheduling.due_calls import LATE_SHARE, DueCalls, collision_s
from extproc.types import BlockHash, Candidate, DueCall, Endpoint, EndpointId, LoadSnapshot, RoutingRequest

A, B = EndpointId("10.0.0.1:8000"), EndpointId("10.0.0.2:8000")


def blocks(*ids: int) -> list[BlockHash]:
    return [BlockHash(i) for i in ids]


FIRST = blocks(1, 2, 3)  # a chain's first call
SECOND = blocks(1, 2, 3, 4, 5)  # its next call: extends the first's prompt
OTHER = blocks(90, 91)  # a request that shares nothing


def measured(first_token_in_s: float = 0.1, continued_at_s: float = 1.1) -> DueCalls:
    """A chain's first call routed at 0 s to A, its next one at ``continued_at_s``."""
    due = DueCalls()
    due.routed(A, FIRST, 0.0, first_token_in_s)
    due.continued(FIRST[-1], len(SECOND), continued_at_s)
    return due


def test_nothing_is_due_until_a_continuation_was_measured() -> None:
    due = DueCalls()
    due.routed(A, FIRST, 0.0, 0.1)
    assert due.after_s is None
    assert due.due_s(OTHER, 0.5) == {}


def test_a_call_is_due_the_measured_time_after_the_last_ones_first_token() -> None:
    due = measured()
    assert due.after_s == pytest.approx(1.0)  # 1.1 s routed, first token predicted at 0.1 s
    due.routed(A, SECOND, 1.1, 0.2)
    assert due.due_s(OTHER, 1.5) == {A: pytest.approx((1.1 + 0.2 + 1.0 - 1.5,))}  # due on A only


def test_the_continued_call_is_no_longer_due() -> None:
    due = measured()
    assert due.due_s(OTHER, 1.2) == {}  # the first call was continued at 1.1 s


def test_a_repeat_is_no_continuation() -> None:
    due = DueCalls()
    due.routed(A, FIRST, 0.0, 0.1)
    due.continued(FIRST[-1], len(FIRST), 0.2)  # the same prompt again, at once
    assert due.after_s is None
    due.continued(FIRST[-1], len(SECOND), 1.1)  # the call that extends it is still measured
    assert due.after_s == pytest.approx(1.0)


def test_a_request_is_not_due_beside_itself() -> None:
    due = measured()
    due.routed(A, SECOND, 1.1, 0.2)
    third = blocks(1, 2, 3, 4, 5, 6)  # extends the second call's prompt: it is that due call
    assert due.due_s(third, 2.2) == {}
    assert due.due_s(blocks(1, 2, 3, 4, 9, 10), 2.2) == {A: pytest.approx((0.1,))}  # forks before its end


def test_a_late_call_counts_a_while_then_reads_as_a_chain_that_ended() -> None:
    due = measured()
    due.routed(A, SECOND, 1.1, 0.2)  # due at 2.3 s
    late = LATE_SHARE * 1.0
    assert due.due_s(OTHER, 2.3 + late * 0.9) == {A: pytest.approx((-late * 0.9,))}
    assert due.due_s(OTHER, 2.3 + late * 1.1) == {}


def test_a_chain_is_due_after_its_own_last_time() -> None:
    due = measured()  # the chain's second call came 1.0 s after the first's first token
    assert due.continued(FIRST[-1], len(SECOND), 1.5) is None  # consumed already
    due.routed(A, SECOND, 1.1, 0.2, after_s=1.0)
    due.routed(B, OTHER, 1.2, 0.1)  # a first call: due after the mean
    due.continued(BlockHash(70), 2, 1.3)  # unknown: nothing measured
    # another chain measured 3 s: the mean moves to 1.2 s, the chain that took 1.0 s is still due after 1.0 s
    due.routed(A, blocks(50), 1.3, 0.1)
    assert due.continued(BlockHash(50), 2, 1.4 + 3.0) == pytest.approx(3.0)
    assert due.after_s == pytest.approx(1.2)
    assert due.due_s(blocks(80), 2.0) == {A: pytest.approx((1.1 + 0.2 + 1.0 - 2.0,)),
                                          B: pytest.approx((1.2 + 0.1 + 1.2 - 2.0,))}  # fmt: skip


def test_the_measured_time_is_a_running_mean() -> None:
    due = measured()
    due.routed(A, SECOND, 1.1, 0.2)
    due.continued(SECOND[-1], 6, 1.1 + 0.2 + 3.0)  # a slower step: 3 s after its first token
    assert due.after_s == pytest.approx(1.0 + 0.1 * (3.0 - 1.0))


def test_memory_is_bounded_and_long_past_calls_are_forgotten() -> None:
    due = DueCalls(memory=2)
    for i in range(3):
        due.routed(A, blocks(100 + i), 0.0, 0.1)
    due.continued(BlockHash(100), 2, 1.0)  # forgotten: not measured
    assert due.after_s is None
    due.continued(BlockHash(101), 2, 1.1)
    assert due.after_s == pytest.approx(1.0)
    due.routed(B, blocks(200), 10.0, 0.1)  # 102's call was due at 1.1 s: long past, forgotten
    due.continued(BlockHash(102), 2, 10.0)
    assert due.after_s == pytest.approx(1.0)
    with pytest.raises(ValueError, match="at least 1"):
        DueCalls(memory=0)


def test_a_call_another_replica_routed_is_due_as_if_routed_here_when_heard() -> None:
    due = measured()  # chains take 1.0 s
    due.heard(DueCall(B, SECOND[-1], len(SECOND), 0.2), 1.1)  # another replica's first call, heard at 1.1 s
    assert due.due_s(OTHER, 1.5) == {B: pytest.approx((1.1 + 0.2 + 1.0 - 1.5,))}
    # its continuation, routed here, is measured against it
    assert due.continued(SECOND[-1], 6, 1.1 + 0.2 + 0.8) == pytest.approx(0.8)


def test_a_heard_continuation_ends_the_call_it_continues_and_its_time_counts() -> None:
    due = DueCalls()
    due.routed(A, FIRST, 0.0, 0.1)  # routed here; the other replica routes its next call
    due.heard(DueCall(A, SECOND[-1], len(SECOND), 0.2, after_s=1.0, continues=FIRST[-1]), 1.1)
    assert due.after_s == pytest.approx(1.0)  # measured there, counted here
    assert due.due_s(OTHER, 1.2) == {A: pytest.approx((1.1 + 0.2 + 1.0 - 1.2,))}  # only the second call is due
    assert due.continued(FIRST[-1], len(SECOND), 1.2) is None  # the first is no longer remembered


def test_a_heard_repeat_does_not_end_the_call_it_repeats() -> None:
    due = measured()
    due.routed(A, SECOND, 1.1, 0.2)
    due.heard(DueCall(B, SECOND[-1], len(SECOND), 0.1, continues=SECOND[-1]), 1.2)  # the same prompt again
    assert due.after_s == pytest.approx(1.0)
    assert due.due_s(OTHER, 1.5) == {B: pytest.approx((1.2 + 0.1 + 1.0 - 1.5,))}  # the latest routing of it


def cand(*due_s: float) -> Candidate:
    return Candidate(Endpoint(A), LoadSnapshot(known=True, calls_due_s=due_s), 0, precise=True)


REQUEST = RoutingRequest("r1", "m", "m", None, 1280, blocks(*range(80)), 16, chain_followers=4.0)

COLLISIONS = [
    # each due call before the first token (0.1 s) waits until it; a late one, the whole estimate; 4 calls per
    # chain's start: a call is followed 4 times in 5
    ((0.03,), 4.0, 0.8 * 0.07),
    ((0.03, -0.01, 0.2), 4.0, 0.8 * (0.07 + 0.1)),
    ((0.2,), 4.0, 0.0),
    ((0.03,), 0.0, 0.0),  # no chains: nothing recurs, and a call is not followed
    ((0.03,), 0.5, 0.5 * (0.5 / 1.5) * 0.07),  # half a call per start: the floor's share and the odds both shrink
    ((), 4.0, 0.0),
]


@pytest.mark.parametrize(("due_s", "chains", "expected_s"), COLLISIONS)
def test_a_request_placed_before_a_due_call_costs_it_its_wait(
    due_s: tuple[float, ...], chains: float, expected_s: float
) -> None:
    request = replace(REQUEST, chain_followers=chains)
    assert collision_s(request, cand(*due_s), 0.1) == pytest.approx(expected_s)
