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

The same window also says how long chains of requests run (``chain_followers``): a warm decision whose cached
prefix ends in blocks one earlier request stored on that endpoint and nobody hit or placed there since
*continued* that request's own context (an agent's next call, a conversation's next turn); every other counted
decision started something (a chain's first call on a shared prefix, a question about a document, a new
prompt). Continued per started is how many calls a chain's start brings along, measured:
``sessions.invested_estimates`` counts them as reuse of a shared prefix copied for that start, and
``sessions.floor_share`` how far the estimate's busy floor counts. No evidence reads as none (the fading prior
is one started decision).
"""

from __future__ import annotations

import math
from collections import deque

from extproc.types import Reason

__all__ = ["PRIOR_DECISIONS", "WINDOW_DECISIONS", "PrefixReuse"]

WINDOW_DECISIONS = 64
"""The decisions the ratio looks back over: a few seconds of traffic at the rates one picker serves."""
PRIOR_DECISIONS = 1
"""Warm and cold decisions counted in advance (as many of each) while the window is empty, fading linearly to
none as it fills: one follower per placement until the decisions say otherwise."""

_WARM = frozenset({Reason.CACHE, Reason.HOLD, Reason.MOVE, Reason.SPILL})
_COLD = frozenset({Reason.LOAD})


class PrefixReuse:
    """The last ``window`` decisions' warm and cold counts, fed one reason per decision."""

    def __init__(self, window: int = WINDOW_DECISIONS, prior: int = PRIOR_DECISIONS) -> None:
        if window < 1 or prior < 1:
            raise ValueError(f"window ({window}) and prior ({prior}) must be at least 1")
        self._window = window
        self._recent: deque[tuple[bool, bool]] = deque(maxlen=window)  # (warm, continued)
        self._warm = 0
        self._continued = 0
        self._prior = prior

    def decided(self, reason: Reason, *, continued: bool = False) -> None:
        """Count one decision by its reason (those that say nothing of the prefix are skipped); ``continued``:
        a warm one whose cached prefix ended in blocks one earlier request stored and nobody hit or placed since
        (module docstring)."""
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

    def chain_followers(self) -> float:
        """Continued decisions per started one lately, one started counted in advance while the window fills
        (and at least one counted: a window that only continued reads as one chain)."""
        seen = len(self._recent)
        started = seen - self._continued + self._prior * (1 - seen / self._window)
        return self._continued / max(started, 1.0)
