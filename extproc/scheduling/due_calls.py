"""Calls that are due: when and where each recent request's next call (a chain's continuation) is expected, and
what a request placed beside them costs them.

A chain's calls come one after another: the next call arrives some time after the last one's first token (its
decode, then the client's turn), and it finds its context on the endpoint the last call went to. A request
placed there whose prefill is still running when that call arrives makes it wait; and since both chains keep
their gap between calls, the next calls meet again, every call of both (the lockstep pair,
``docs/scheduling.md``, "Chains that start beside a prefill"). The busy floor sees a prefill of ours that
runs *now*; a call that is due in the next few tens of milliseconds shows in no load at all. On agents at
6 req/s every remaining lockstep pair formed that way: another chain's first call landed on the endpoint
23-40 ms before this chain's next call (``bench/results/chain-starts``).

``DueCalls`` (the decider's state) remembers each routed request's endpoint and predicted first token, and
measures the time from a call's predicted first token to the call that continues it. A chain's next call is
expected after its last call's first token by the time the chain itself took last; after a chain's first call,
by the mean over all chains (``after_s``). The time is mostly the call's decode, which the endpoint's batch
sets: on agents at 6 req/s (``bench/results/due-calls``) the mean put a call that came 42 ms after a start
beyond the start's first token (92 ms away), 50 ms or more off, where the chain's own last time was 5 ms off.

``collision_s`` (pure) prices a candidate: each call due there before this request's own first token waits for
it, weighed by how likely a call is followed at all and by the busy floor's share (``sessions.floor_share``):
what recurs on every call counts as far as requests continue chains. With no chains measured it is 0, and
every decision is as before. Replicas tell each other their calls (``heard``, ``index.share_due_calls``):
through two replicas a chain's first call landed where the other replica's chain had its next call due, and
the two chains met on every call after (``bench/results/x2-stop43``). Not thread-safe: the event loop.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from extproc.scheduling.sessions import floor_share
from extproc.types import BlockHash, Candidate, DueCall, EndpointId, RoutingRequest

__all__ = ["DUE_CALLS_MEMORY", "LATE_SHARE", "DueCalls", "collision_s"]

DUE_CALLS_MEMORY = 256
"""The recent requests remembered: a chain's next call comes within a few seconds of traffic."""
LATE_SHARE = 0.2
"""How late (a share of the measured time to the next call) a due call still counts as on its way: the rest of
the time it is taken for a chain that ended (its last call has no continuation)."""
_MEAN_WEIGHT = 0.1  # the running mean's weight of each new measurement: about the last ten continuations


@dataclass(frozen=True, slots=True)
class _Call:
    endpoint: EndpointId
    first_token_at_s: float  # predicted, on the decider's clock
    blocks: int  # the prompt's full blocks: a continuation's hashes hold this call's last one at ``blocks - 1``
    after_s: float | None  # the time its chain took from its last call's first token to it; None: a first call

    def expected_after_s(self, mean_s: float) -> float:
        """Seconds from this call's first token to its chain's next call: the time its chain took last, or the
        chains' mean ``mean_s`` after a chain's first call."""
        return mean_s if self.after_s is None else self.after_s


class DueCalls:
    """Each remembered request's endpoint and predicted first token, keyed by its prompt's last full block."""

    def __init__(self, memory: int = DUE_CALLS_MEMORY) -> None:
        if memory < 1:
            raise ValueError(f"memory ({memory}) must be at least 1")
        self._memory = memory
        self._calls: OrderedDict[BlockHash, _Call] = OrderedDict()
        self._after_s: float | None = None

    @property
    def after_s(self) -> float | None:
        """Mean seconds from a call's predicted first token to the call that continued it; None until one did."""
        return self._after_s

    def routed(
        self,
        endpoint: EndpointId,
        hashes: Sequence[BlockHash],
        now_s: float,
        first_token_in_s: float,
        after_s: float | None = None,
    ) -> None:
        """A request whose prompt's full blocks are ``hashes`` went to ``endpoint`` at ``now_s``, its first token
        predicted ``first_token_in_s`` later; ``after_s``: what ``continued`` measured for it, if it continues a
        chain."""
        if hashes:
            self._remember(hashes[-1], _Call(endpoint, now_s + max(first_token_in_s, 0.0), len(hashes), after_s), now_s)

    def heard(self, call: DueCall, now_s: float) -> None:
        """Another replica routed ``call`` (heard at ``now_s``, milliseconds after): remembered as if routed here
        then. The call it continues (a remembered prompt that it extends) is no longer due, and the time its
        chain took, as that replica measured it, counts in ``after_s``: with replicas each one routes part of a
        chain's calls, and each then knows every call due and the whole fleet's continuations."""
        if call.continues is not None:
            self._take(call.continues, call.blocks)
        if call.after_s is not None:
            self._measured(call.after_s)
        first_token_at_s = now_s + max(call.first_token_in_s, 0.0)
        self._remember(call.block, _Call(call.endpoint, first_token_at_s, call.blocks, call.after_s), now_s)

    def _remember(self, block: BlockHash, call: _Call, now_s: float) -> None:
        self._calls[block] = call
        self._calls.move_to_end(block)
        self._forget_old(now_s)

    def continued(self, block: BlockHash, blocks: int, now_s: float) -> float | None:
        """A request routed at ``now_s``, whose prompt has ``blocks`` full blocks, extends the remembered prompt
        ending in ``block``: that call is no longer due, and the time since its predicted first token is
        measured, returned (for ``routed``) and counted in ``after_s``. A request no longer than that prompt
        repeats it (a retry, the same question again): no chain's next call, and nothing is measured (repeats
        sent back to back read as calls due at once, and two replicas that each saw their own spread a burst
        unevenly). None when nothing was measured."""
        call = self._take(block, blocks)
        if call is None:
            return None
        sample = max(now_s - call.first_token_at_s, 0.0)
        self._measured(sample)
        return sample

    def _take(self, block: BlockHash, blocks: int) -> _Call | None:
        """The remembered call whose prompt ends in ``block``, no longer due, when a request of ``blocks`` full
        blocks extends it; None (and it stays) when none is remembered or the request repeats it."""
        call = self._calls.get(block)
        if call is None or blocks <= call.blocks:
            return None
        del self._calls[block]
        return call

    def _measured(self, sample_s: float) -> None:
        mean = self._after_s
        self._after_s = sample_s if mean is None else mean + _MEAN_WEIGHT * (sample_s - mean)

    def due_s(self, hashes: Sequence[BlockHash], now_s: float) -> dict[EndpointId, tuple[float, ...]]:
        """Per endpoint, seconds from ``now_s`` until each call expected there (negative: late, by at most
        ``LATE_SHARE`` of the time expected), leaving out the one a request with ``hashes`` would itself be (it
        extends that call's prompt). Empty until ``after_s`` is measured."""
        mean = self._after_s
        if mean is None:
            return {}
        out: dict[EndpointId, list[float]] = {}
        for block, call in self._calls.items():
            after = call.expected_after_s(mean)
            due = call.first_token_at_s + after - now_s
            if due < -LATE_SHARE * after or (call.blocks <= len(hashes) and hashes[call.blocks - 1] == block):
                continue
            out.setdefault(call.endpoint, []).append(due)
        return {endpoint: tuple(due) for endpoint, due in out.items()}

    def _forget_old(self, now_s: float) -> None:
        """Past the memory, the oldest; once ``after_s`` is measured, also the oldest whose call is past due by
        more than twice the time expected (a continuation that late is not measured: it is no longer a chain's
        next call)."""
        while len(self._calls) > self._memory:
            self._calls.popitem(last=False)
        mean = self._after_s
        if mean is None:
            return
        while self._calls:
            oldest = next(iter(self._calls.values()))
            after = oldest.expected_after_s(mean)
            if oldest.first_token_at_s + 3 * after >= now_s:
                return
            self._calls.popitem(last=False)


def collision_s(request: RoutingRequest, candidate: Candidate, estimate_s: float) -> float:
    """What sending ``request`` to ``candidate`` (its first token ``estimate_s`` from now) costs the calls due
    there: each one arriving before that first token waits until it (one that is late, any moment now: the
    whole estimate), weighed by how likely a call is followed (continued per started, as a share) and by the
    busy floor's share: the meeting comes back on every call as far as requests continue chains. Pure."""
    due = candidate.load.calls_due_s
    chains = request.chain_followers
    if not due or chains <= 0:
        return 0.0
    followed = chains / (1.0 + chains)
    waits = sum(estimate_s - max(d, 0.0) for d in due if d < estimate_s)
    return floor_share(request) * followed * waits
