"""``PrefixReuse``: warm decisions per cold one over a bounded window, with a prior of one follower each."""

import math

import pytest

from extproc.scheduling.prefix_reuse import PrefixReuse
from extproc.types import Reason


def test_no_evidence_reads_as_one_follower_per_placement() -> None:
    assert PrefixReuse().followers() == 1.0


def test_unfollowed_placements_close_the_window() -> None:
    reuse = PrefixReuse(window=64, prior=4)
    for _ in range(16):
        reuse.decided(Reason.LOAD)
    assert reuse.followers() == pytest.approx(3 / 19)  # the prior has faded to 3 of each
    for _ in range(100):
        reuse.decided(Reason.LOAD)
    assert reuse.followers() == 0.0  # a full window: evidence alone


def test_followed_placements_keep_it_open() -> None:
    # tenants' shape: a group's prefix placed once, then its users' requests find it
    reuse = PrefixReuse(window=64, prior=4)
    for reason in [Reason.LOAD, Reason.CACHE, Reason.HOLD, Reason.CACHE, Reason.MOVE, Reason.SPILL] * 10:
        reuse.decided(reason)
    assert reuse.followers() > 1.0


def test_old_decisions_leave_the_window() -> None:
    reuse = PrefixReuse(window=8, prior=1)
    for _ in range(4):
        reuse.decided(Reason.CACHE)
    assert reuse.followers() == pytest.approx(4.5 / 0.5)
    for _ in range(4):
        reuse.decided(Reason.CACHE)
    assert reuse.followers() == math.inf  # every decision of a full window warm
    for _ in range(6):
        reuse.decided(Reason.LOAD)
    assert reuse.followers() == pytest.approx(2 / 6)  # the last 8: two warm, six cold


@pytest.mark.parametrize("reason", [Reason.NO_TOKENS, Reason.SHARE, Reason.SHED, Reason.NO_ENDPOINT])
def test_reasons_that_say_nothing_of_the_prefix_are_not_counted(reason: Reason) -> None:
    reuse = PrefixReuse(window=8, prior=1)
    reuse.decided(reason)
    assert reuse.followers() == 1.0


@pytest.mark.parametrize(("window", "prior"), [(0, 4), (64, 0)])
def test_bad_sizes_are_refused(window: int, prior: int) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        PrefixReuse(window=window, prior=prior)


def test_no_evidence_reads_as_no_chain() -> None:
    assert PrefixReuse().chain_followers() == 0.0


def test_chains_are_continued_per_started_decision() -> None:
    # agents' shape: a chain's first call on the shared tools (started), then four calls that continue it
    reuse = PrefixReuse(window=10, prior=1)
    for continued in [False, True, True, True, True] * 2:
        reuse.decided(Reason.CACHE, continued=continued)
    assert reuse.chain_followers() == pytest.approx(8 / 2)  # a full window: the prior has faded
    for _ in range(10):
        reuse.decided(Reason.CACHE)  # questions about a document: each starts something
    assert reuse.chain_followers() == 0.0


def test_only_warm_decisions_continue_and_a_window_of_one_chain_reads_as_one_start() -> None:
    reuse = PrefixReuse(window=4, prior=1)
    reuse.decided(Reason.LOAD, continued=True)  # a cold request continues nothing
    assert reuse.chain_followers() == 0.0
    for _ in range(4):
        reuse.decided(Reason.CACHE, continued=True)
    assert reuse.chain_followers() == 4.0


def test_measured_is_how_full_the_window_is() -> None:
    reuse = PrefixReuse(window=8, prior=1)
    assert reuse.measured() == 0.0
    reuse.decided(Reason.NO_TOKENS)  # says nothing of the prefix: not counted
    for _ in range(4):
        reuse.decided(Reason.CACHE)
    assert reuse.measured() == 0.5
    for _ in range(10):
        reuse.decided(Reason.LOAD)
    assert reuse.measured() == 1.0
