"""Leaving a warm endpoint as an investment (``scheduling/sessions.py``) and the learned cost model in the
estimate (``Candidate.cost``): table tests on the shipped defaults.

Numbers: the defaults' 12,000 tokens/s and 0.004 slowdown per running request. An agent's first call is 1,280
tokens: 1,024 of shared tools (64 blocks, cached on A) and its task; 256 uncached on A (0.021 s), 1,280 on an
empty B (0.107 s: a copy of 0.085 s).
"""

import random
from dataclasses import replace

import pytest

from extproc.config import SchedulingConfig
from extproc.scheduling.build import build_profile
from extproc.scheduling.estimate import cost_terms, estimate_ttft_s
from extproc.scheduling.profiles import TtftProfile
from extproc.scheduling.sessions import lasting_hits
from extproc.types import (
    BlockHash,
    Candidate,
    Endpoint,
    EndpointId,
    LearnedCost,
    LoadSnapshot,
    Reason,
    RoutingRequest,
)

A, B, C = EndpointId("10.0.0.1:8000"), EndpointId("10.0.0.2:8000"), EndpointId("10.0.0.3:8000")
DEFAULT = build_profile(SchedulingConfig())
assert isinstance(DEFAULT, TtftProfile)
PILED = LearnedCost(base_s=0.0, prefill_scale=1.0, interference_per_running=0.05, queue_scale=1.0)


def cand(
    eid: EndpointId,
    cached: int,
    *,
    queued: float = 0.0,
    running: int = 0,
    waiting: int = 0,
    routed: int = 0,  # routed there since the last scrape, all before their predicted first tokens
    hits: int = 0,
    gap: float | None = None,
    hot: int | None = 0,
    cost: LearnedCost | None = None,
    busy: float = 0.0,
    due: tuple[float, ...] = (),
) -> Candidate:
    load = LoadSnapshot(
        known=True, queued_prefill_tokens=queued, running=running, waiting=waiting, inflight_requests=routed,
        queued_requests=routed, prefill_busy_s=busy, calls_due_s=due,
    )  # fmt: skip
    endpoint = Endpoint(eid, num_gpu_blocks=1024)
    return Candidate(
        endpoint, load, cached, precise=True, hot_blocks=hot, cost=cost, prefix_hits=hits, prefix_hit_gap_s=gap
    )


def req(tokens: int) -> RoutingRequest:
    return RoutingRequest("r1", "m", "m", None, tokens, [BlockHash(i) for i in range(tokens // 16)], 16)


TABLE = [
    # an agent's first call: tools on A, which runs 16 sessions; B idle and empty
    ([cand(A, 64, queued=500, running=16), cand(B, 0)], 1280, A, Reason.CACHE, "tools-copy-not-yet-reused-stays"),
    ([cand(A, 64, queued=500, running=16, hits=9), cand(B, 0)], 1280, B, Reason.MOVE, "tools-reused-10x-copied"),
    ([cand(A, 64, queued=500, running=16, hits=9), cand(B, 0, waiting=1)], 1280, A, Reason.CACHE,
     "busy-target-is-no-move"),
    ([cand(A, 64, queued=500, running=16, hits=9), cand(B, 0, hot=1024)], 1280, A, Reason.CACHE,
     "no-room-for-the-copy-is-no-move"),
    # requests routed since the last scrape (10 ms each in the estimate) are a bridge, not load that lasts
    ([cand(A, 64, routed=5, hits=9), cand(B, 0)], 1280, A, Reason.CACHE, "routed-since-scrape-is-no-reason"),
    # the piled backend's decode interference as learned: a prefix reused 3x pays for its copy only then
    ([cand(A, 64, queued=500, running=16, hits=2), cand(B, 0)], 1280, A, Reason.CACHE, "configured-cost-stays"),
    ([cand(A, 64, queued=500, running=16, hits=2, cost=PILED), cand(B, 0, cost=PILED)], 1280, B, Reason.MOVE,
     "learned-interference-moves"),
    # hysteresis: a session that moved to B (its whole context there, hit only by itself) does not move back to
    # an idle A for less than the copy back and forth (456 tokens on A vs 200 plus 300 queued on B)
    ([cand(A, 64), cand(B, 80, queued=300)], 1480, B, Reason.CACHE, "session-does-not-ping-pong"),
    ([cand(A, 64), cand(B, 80, queued=2000)], 1480, A, Reason.MOVE, "session-leaves-a-real-queue"),
]  # fmt: skip


@pytest.mark.parametrize(("candidates", "tokens", "pick", "reason"), [row[:4] for row in TABLE],
                         ids=[row[4] for row in TABLE])  # fmt: skip
def test_moves_spread_the_copy_over_the_prefix_reuse(
    candidates: list[Candidate], tokens: int, pick: EndpointId, reason: Reason
) -> None:
    decision = DEFAULT.decide(req(tokens), candidates, random.Random(0))
    assert (decision.endpoints[0], decision.reason) == (pick, reason)


CHAINS = [
    # a chain's first call on the shared tools, 30 ms after another call was routed to A (predicted to prefill
    # for 30 ms yet): beside it, every call of both chains would collide; the tools were hit 4 times
    ([cand(A, 64, hits=4, busy=0.03), cand(B, 0)], 1280, 0.0, A, Reason.CACHE, "start-beside-a-prefill-no-chains"),
    ([cand(A, 64, hits=4, busy=0.03), cand(B, 0)], 1280, 4.0, B, Reason.MOVE, "start-beside-a-prefill-with-chains"),
    ([cand(A, 64, hits=4), cand(B, 0)], 1280, 4.0, A, Reason.CACHE, "start-on-an-idle-holder-stays"),
    # a question about a shared document, no chains: the prefill beside it delays it once, no reason to copy
    ([cand(A, 64, hits=9, busy=0.06), cand(B, 0)], 1280, 0.0, A, Reason.CACHE, "one-off-beside-a-prefill-stays"),
    # a call that continues its own context (hit by nobody before): its chain's length does not pay the copy
    ([cand(A, 80, busy=0.06), cand(B, 0)], 1480, 4.0, A, Reason.CACHE, "continuation-beside-a-prefill-stays"),
    # two endpoints hold the tools: a chain starts on the one not prefilling, no copy at all
    ([cand(A, 64, hits=3, busy=0.06), cand(B, 64, hits=3)], 1280, 4.0, B, Reason.CACHE,
     "of-two-holders-the-one-not-prefilling"),
    # B's copy of the tools (no hits yet) still prefills, A prefills another start: a chain's start reads the
    # tools' reuse where they were hit and copies them to idle C rather than collide on either holder
    ([cand(A, 64, hits=6, busy=0.06, running=4), cand(B, 64, busy=0.04), cand(C, 0)], 1280, 4.0, C, Reason.MOVE,
     "a-start-does-not-follow-a-copy-that-still-prefills"),
    # without chains a second holder's copy reads its own hits: no third copy for a one-off question
    ([cand(A, 64, hits=6, busy=0.06, running=4), cand(B, 64, busy=0.04), cand(C, 0)], 1280, 0.0, B, Reason.CACHE,
     "without-chains-no-third-copy"),
    # another chain's next call is due on A in 10 ms, before this start's first token: it would wait for this
    # prefill, and the two chains would meet on every call (``scheduling.due_calls``)
    ([cand(A, 64, hits=4, due=(0.01,)), cand(B, 0)], 1280, 4.0, B, Reason.MOVE, "start-before-a-due-call-copies"),
    ([cand(A, 64, hits=4, due=(0.01,)), cand(B, 0)], 1280, 0.0, A, Reason.CACHE, "due-calls-without-chains-stay"),
    ([cand(A, 64, hits=4, due=(0.5,)), cand(B, 0)], 1280, 4.0, A, Reason.CACHE, "a-call-due-after-it-stays"),
    # two holders: the one where no call is due, though its estimate is a little higher
    ([cand(A, 64, hits=3, due=(0.01,)), cand(B, 64, hits=3, running=2)], 1280, 4.0, B, Reason.CACHE,
     "of-two-holders-the-one-no-call-is-due-on"),
]  # fmt: skip


BURSTS = [
    # the tools reused 10x, A's queue lasting ~0.1 s: what matters is whether those uses meet it
    ([cand(A, 64, queued=500, running=16, hits=9, gap=0.01), cand(B, 0)], 1280, 0.0, B, Reason.MOVE,
     "uses-every-10-ms-meet-the-queue"),
    # tenants at 8 req/s: each group's prefix comes back every ~2 s, long after the burst on A drained
    ([cand(A, 64, queued=500, running=16, hits=9, gap=2.0), cand(B, 0)], 1280, 0.0, A, Reason.CACHE,
     "uses-every-2-s-miss-a-burst"),
    # chains keep their load: every later use of the prefix meets it, however far apart they start
    ([cand(A, 64, queued=500, running=16, hits=9, gap=2.0), cand(B, 0)], 1280, 1.0, B, Reason.MOVE,
     "chains-keep-the-load"),
]  # fmt: skip


@pytest.mark.parametrize(("candidates", "tokens", "chains", "pick", "reason"), [row[:5] for row in CHAINS + BURSTS],
                         ids=[row[5] for row in CHAINS + BURSTS])  # fmt: skip
def test_a_copy_is_spread_over_the_calls_a_start_brings_and_the_uses_that_meet_the_queue(
    candidates: list[Candidate], tokens: int, chains: float, pick: EndpointId, reason: Reason
) -> None:
    request = replace(req(tokens), chain_followers=chains)
    decision = DEFAULT.decide(request, candidates, random.Random(0))
    assert (decision.endpoints[0], decision.reason) == (pick, reason)


@pytest.mark.parametrize(
    ("gap_s", "chains", "measured", "expected"),
    [
        (None, 0.0, 1.0, 9.0),  # gaps not measured: every hit counts
        (1.0, 0.0, 1.0, 0.5),  # one-off requests a second apart: half a use meets a queue lasting 0.5 s
        (0.01, 0.0, 1.0, 9.0),  # ... but never more than the hits seen
        (1.0, 0.5, 1.0, 0.5 * 9 + 0.5 * 0.5),  # half the decisions continue chains: half the hits keep their load
        (1.0, 3.0, 1.0, 9.0),  # chains: every hit
        # a picker's first decisions: no chain measured yet reads as lasting load, fading as the window fills
        (1.0, 0.0, 0.0, 9.0),
        (1.0, 0.0, 0.5, 0.5 * 9 + 0.5 * 0.5),
    ],
    ids=["unmeasured", "one-off", "capped-by-hits", "half-chained", "chained", "no-evidence", "half-evidence"],
)
def test_the_hits_that_meet_the_queue(gap_s: float | None, chains: float, measured: float, expected: float) -> None:
    warm = cand(A, 64, hits=9, gap=gap_s)
    request = replace(req(1280), chain_followers=chains, chains_measured=measured)
    assert lasting_hits(request, warm, 0.5) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("busy_s", "share", "expected_s"),
    [
        (0.0, 1.0, 0.24),  # nothing of ours prefilling there: the terms
        (0.05, 1.0, 0.24),  # a short one: the terms already wait longer
        (0.5, 1.0, 0.56),  # a long one: what is left of it, then this request's own prefill alone
        (0.5, 0.5, 0.24 + 0.5 * (0.56 - 0.24)),  # counted as far as requests continue chains
        (0.5, 0.0, 0.24),
    ],
    ids=["idle", "floor-below-the-terms", "floor-above-the-terms", "half-share", "no-share"],
)
def test_a_prefill_we_routed_is_a_floor_under_the_estimate(busy_s: float, share: float, expected_s: float) -> None:
    # terms: 0.03 + 2.0 x (600 queued + 120 uncached) / 12,000 x (1 + 0.05 x 10) + 1.5 x 2 x 0.01 = 0.24 s;
    # floor: busy + 0.03 + 2.0 x 120 / 12,000 x 1.5 = busy + 0.06 s
    load = LoadSnapshot(known=True, queued_prefill_tokens=600, running=10, waiting=1, queued_requests=1,
                        prefill_busy_s=busy_s)  # fmt: skip
    cost = LearnedCost(0.03, 2.0, 0.05, 1.5)
    c = Candidate(Endpoint(A), load, 0, precise=True, cost=cost)
    params = replace(DEFAULT.params, prefill_tokens_per_s=12000.0)
    assert estimate_ttft_s(c, 120, 16, params, share) == pytest.approx(expected_s)
    # the calibration learns the weights from the terms: the floor's share is not theirs
    assert cost_terms(c, 120, 16, params, share).unlearned_s(cost) == pytest.approx(expected_s - 0.24)


@pytest.mark.parametrize(
    ("cost", "expected_s"),
    [
        # configured: the fixed cost is the per-request overhead (0.01 s), paid once more for the request itself
        (None, 0.01 + (0.05 + 0.01) * (1 + 0.004 * 10) + 2 * 0.01),
        (LearnedCost(0.03, 2.0, 0.05, 1.5), 0.03 + 2.0 * 0.06 * (1 + 0.05 * 10) + 1.5 * 2 * 0.01),
    ],
    ids=["configured", "learned"],
)
def test_a_learned_cost_reweighs_the_estimates_terms(cost: LearnedCost | None, expected_s: float) -> None:
    load = LoadSnapshot(known=True, queued_prefill_tokens=600, running=10, waiting=1, queued_requests=1)
    c = Candidate(Endpoint(A), load, 0, precise=True, cost=cost)
    params = replace(DEFAULT.params, prefill_tokens_per_s=12000.0)
    assert estimate_ttft_s(c, 120, 16, params) == pytest.approx(expected_s)
