"""``PrefixReuse``: warm decisions per cold one over a bounded window, with a prior of one follower each, and
continued per started one (chains); ``PromptEnds``: where recent prompts ended, and when."""

import math

import pytest

from extproc.scheduling.prefix_reuse import PrefixReuse, PromptEnds
from extproc.types import BlockHash, Reason


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


def test_while_the_window_fills_starts_younger_than_the_gap_do_not_count_against_continuations() -> None:
    # agents' first seconds at 12 req/s: two chains started, the first continued 1.4 s after its start, two
    # more started just now (the fifth decision is where the first lockstep pair formed)
    reuse = PrefixReuse(window=64, prior=1)
    reuse.decided(Reason.LOAD, at_s=0.0)  # the first chain's first call, placed cold
    reuse.decided(Reason.CACHE, at_s=0.96)  # the second chain's first call, on the shared tools
    reuse.decided(Reason.CACHE, continued=True, at_s=1.40, gap_s=1.40)  # the first chain's second call
    reuse.decided(Reason.CACHE, at_s=2.06)  # the third chain's first call
    ratio = 1 / (3 + 60 / 64)
    assert reuse.chain_followers() == pytest.approx(ratio)  # without a clock: the ratio alone
    # only the start at 0 s is at least the gap (1.4 s) old at 2.08 s: one continuation per start that could
    assert reuse.chain_followers(2.08) == pytest.approx(4 / 64 * ratio + 60 / 64 * 1.0)
    # later, every start is old enough (and a start with no continuation yet counts against them)
    assert reuse.chain_followers(3.5) == pytest.approx(4 / 64 * ratio + 60 / 64 * 1 / 3)


def test_without_a_measured_gap_or_with_a_full_window_the_ratio_alone() -> None:
    reuse = PrefixReuse(window=4, prior=1)
    reuse.decided(Reason.CACHE, at_s=0.0)
    reuse.decided(Reason.CACHE, continued=True, at_s=1.0)  # continued, but how long after is not known
    assert reuse.chain_followers(5.0) == reuse.chain_followers() == pytest.approx(1 / (1 + 2 / 4))
    for at_s in (2.0, 3.0):
        reuse.decided(Reason.CACHE, continued=True, at_s=at_s, gap_s=1.0)
    assert reuse.chain_followers(9.0) == reuse.chain_followers() == 3.0  # a full window: 3 continued, 1 started
    reuse.decided(Reason.CACHE, at_s=10.0)  # the oldest start leaves; the window stays full
    assert reuse.chain_followers(10.0) == reuse.chain_followers() == 3.0


def test_prompt_ends_say_when_a_prompt_ending_in_a_block_was_routed() -> None:
    ends = PromptEnds(memory=2)
    ends.routed([BlockHash(1), BlockHash(2)], 1.0)
    assert ends.since_s(BlockHash(2), 3.5) == 2.5
    assert ends.since_s(BlockHash(1), 3.5) is None  # inside a prompt, not its end
    ends.routed([BlockHash(1), BlockHash(2)], 2.0)  # the same prompt again: the latest counts
    assert ends.since_s(BlockHash(2), 3.5) == 1.5
    ends.routed([], 2.5)  # no full block: nothing to remember
    ends.routed([BlockHash(3)], 3.0)
    ends.routed([BlockHash(4)], 3.0)  # memory 2: the oldest is forgotten
    assert ends.since_s(BlockHash(2), 3.5) is None
    assert ends.since_s(BlockHash(3), 3.5) == 0.5
    with pytest.raises(ValueError, match="memory"):
        PromptEnds(memory=0)
