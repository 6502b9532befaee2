"""How many requests followed each new prefix lately: what a cold placement's window is worth.

A cold request (no endpoint holds a useful share of its prompt: reason ``load``) places a new prefix.
``TtftProfile._place`` then gives up to ``stickiness_s`` of this request's own estimate to put the prefix where
the least hot traffic lives, so that the requests that will follow it do not pile on one endpoint. That trade
pays only if requests do follow. On traffic whose prompts share nothing (the unique workload) none ever does,
and the window only made placements worse than round robin's (``docs/scheduling.md``).

The decisions themselves say how often prefixes are followed: of this replica's last ``WINDOW_DECISIONS``
decisions, the warm ones (a cached prefix was found: cache, hold, move, spill) per cold one (load). Before the
window is full, ``PRIOR_DECISIONS`` of each are counted in advance, fading as decisions fill it: no evidence
reads as one follower per placement, the window's full width; a full window is evidence alone, so on traffic
that shares nothing the placement window closes entirely and placement is by estimate (measured: a window
left at even 1/65 of ``stickiness_s`` kept unique at 1.05-1.08x round robin's TTFT p90; closed, 1.01x). A first
burst of placements of prefixes that will be followed (tenants: 16 groups placed in the first second) sees warm
requests among it: the ratio stays near one there. Decisions whose reason says nothing of the prefix (no tokens,
tenant shares, shed) are not counted. Not thread-safe: the event loop.

The same window also says how long chains of requests run (``chain_followers``). A warm decision *continued* an
earlier request's own context (an agent's next call, a conversation's next turn) when its cached prefix ends in
blocks one earlier request stored on that endpoint and nobody hit or placed there since, or ends where a recent
request's prompt ended (``PromptEnds``: it extends that whole prompt, placed or not, as a chain's second call
extends its first); every other counted decision started something (a chain's first call on a shared prefix, a
question about a document, a new prompt). Continued per started is how many calls a chain's start brings along,
measured: ``sessions.invested_estimates`` counts them as reuse of a shared prefix copied for that start, and
``sessions.floor_share`` how far the estimate's busy floor counts. No evidence reads as none (the fading prior
is one started decision).

While the window fills, that ratio reads chains short: a chain's calls come one gap apart (the time from a call
to the call that continues it, measured on each continuation), so the chains started less than a gap ago cannot
have been continued yet, and counting them as starts that brought nothing dilutes the evidence. Until the
window is full the ratio is blended, by how full it is, with continued per start *at least the mean gap old*.
On agents at 12 req/s in a fresh picker (``bench/results/chain-starts``) the first lockstep pair formed at the
fifth decision: the ratio read 0 there (its one continuation extended a prompt placed cold, a start by the
hot-set reading alone), 0.25 with that continuation counted, and the blend 0.97. A full window is the ratio
alone, as before.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Sequence

from extproc.types import BlockHash, Reason

__all__ = ["PRIOR_DECISIONS", "PROMPT_ENDS_MEMORY", "WINDOW_DECISIONS", "PrefixReuse", "PromptEnds"]

WINDOW_DECISIONS = 64
"""The decisions the ratio looks back over: a few seconds of traffic at the rates one picker serves."""
PRIOR_DECISIONS = 1
"""Warm and cold decisions counted in advance (as many of each) while the window is empty, fading linearly to
none as it fills: one follower per placement until the decisions say otherwise."""

PROMPT_ENDS_MEMORY = 4 * WINDOW_DECISIONS
"""The recent prompts whose ends ``PromptEnds`` remembers: a chain's next call comes within a few windows."""

_WARM = frozenset({Reason.CACHE, Reason.HOLD, Reason.MOVE, Reason.SPILL})
_COLD = frozenset({Reason.LOAD})


class PrefixReuse:
    """The last ``window`` decisions' warm and cold counts, fed one reason per decision."""

    def __init__(self, window: int = WINDOW_DECISIONS, prior: int = PRIOR_DECISIONS) -> None:
        if window < 1 or prior < 1:
            raise ValueError(f"window ({window}) and prior ({prior}) must be at least 1")
        self._window = window
        self._recent: deque[tuple[bool, bool]] = deque(maxlen=window)  # (warm, continued)
        self._starts_at_s: deque[float] = deque()  # while the window fills: when its started decisions came
        self._gaps_s: deque[float] = deque()  # while it fills: each continuation's time since the call it continued
        self._warm = 0
        self._continued = 0
        self._prior = prior

    def decided(
        self, reason: Reason, *, continued: bool = False, at_s: float = 0.0, gap_s: float | None = None
    ) -> None:
        """Count one decision by its reason (those that say nothing of the prefix are skipped); ``continued``:
        a warm one that continued an earlier request's own context (module docstring); ``at_s``: when, on the
        clock ``chain_followers`` is read with; ``gap_s``: for a continuation, the time since the request it
        continued, when known."""
        warm = reason in _WARM
        if not warm and reason not in _COLD:
            return
        continued = continued and warm
        if len(self._recent) == self._window:
            gone_warm, gone_continued = self._recent[0]
            self._warm -= gone_warm
            self._continued -= gone_continued
        self._recent.append((warm, continued))
        self._warm += warm
        self._continued += continued
        if len(self._recent) == self._window:  # a full window reads the ratio alone: no starts, no gaps kept
            self._starts_at_s.clear()
            self._gaps_s.clear()
        elif not continued:
            self._starts_at_s.append(at_s)
        elif gap_s is not None and gap_s >= 0:
            self._gaps_s.append(gap_s)

    def followers(self) -> float:
        """Warm decisions per cold one lately, the fading prior included: how many requests followed each new
        prefix. ``math.inf`` when every decision in a full window was warm."""
        seen = len(self._recent)
        prior = self._prior * (1 - seen / self._window)
        cold = seen - self._warm
        if cold + prior == 0:
            return math.inf
        return (self._warm + prior) / (cold + prior)

    def measured(self) -> float:
        """How full the window is (0: no decision yet, 1: ``window`` of them): how far the measures are
        evidence rather than their priors."""
        return len(self._recent) / self._window

    def chain_followers(self, now_s: float | None = None) -> float:
        """Continued decisions per started one lately, one started counted in advance while the window fills
        (and at least one counted: a window that only continued reads as one chain). While it fills and a gap
        has been measured, blended (by how full it is) with continued per start at least the mean gap before
        ``now_s`` (module docstring); without ``now_s``, the ratio alone."""
        seen = len(self._recent)
        started = seen - self._continued + self._prior * (1 - seen / self._window)
        ratio = self._continued / max(started, 1.0)
        if now_s is None or seen >= self._window or not self._gaps_s:
            return ratio
        gap_s = sum(self._gaps_s) / len(self._gaps_s)
        could_continue = sum(1 for at_s in self._starts_at_s if now_s - at_s >= gap_s)
        filled = seen / self._window
        return filled * ratio + (1 - filled) * self._continued / max(could_continue, 1.0)


class PromptEnds:
    """The last full block of each recent request's prompt and when that request was routed: a later request
    whose cached prefix ends in one extends that whole prompt (a chain's next call), and the time since is the
    chain's gap between calls (``PrefixReuse``). Remembers the ``memory`` most recent prompts. Not thread-safe:
    the event loop."""

    def __init__(self, memory: int = PROMPT_ENDS_MEMORY) -> None:
        if memory < 1:
            raise ValueError(f"memory ({memory}) must be at least 1")
        self._memory = memory
        self._routed_at_s: OrderedDict[BlockHash, float] = OrderedDict()  # {a prompt's last full block: when}

    def since_s(self, block: BlockHash, now_s: float) -> float | None:
        """Seconds since a remembered prompt ending in ``block`` was routed (the latest such), else ``None``."""
        at_s = self._routed_at_s.get(block)
        return None if at_s is None else now_s - at_s

    def routed(self, hashes: Sequence[BlockHash], now_s: float) -> None:
        """A request whose prompt's full blocks are ``hashes`` was routed at ``now_s``."""
        if not hashes:
            return
        self._routed_at_s[hashes[-1]] = now_s
        self._routed_at_s.move_to_end(hashes[-1])
        while len(self._routed_at_s) > self._memory:
            self._routed_at_s.popitem(last=False)
