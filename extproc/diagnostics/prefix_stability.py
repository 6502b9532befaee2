"""Prefix-stability detector: finds traffic whose prefixes never repeat because a short span early in the prompt
varies per request (a timestamp or request id at the top of the system prompt), and what it costs.

Pure and synchronous; bounded memory; no prompt text (only ``fingerprints`` granules, keyed per process).

Per request of a stream (model, tenant class), against the stream's recent requests:
1. *Chained view*: the longest common granule prefix with any recent request (``d`` granules) is what prefix
   caching can hit: ``d*G // block_size`` blocks. A request that matches to its end, or extends a recent one
   (a growing agent context), diverges nowhere: nothing to report.
2. *Unchained view*: after the divergence, re-cut the request's granules at shifts of up to ``max_shift_tokens``
   (the span may change length: "9:05" vs "10:05") and look for content of the best-matching recent request
   again within ``max_span_tokens``. If found, the run of matching granules from there is content a stable span
   would have let the cache hit: those blocks are *lost*.
3. A *varying span* is a divergence followed by at least ``MIN_LOST_BLOCKS`` lost blocks. The report over a
   window of recent outcomes names it when it is common (``min_share`` of requests, ``min_findings`` at least).

Data shapes: ``{StreamKey: _Stream}``; ``_Stream.recent``: deque of granule fingerprints (uint64 arrays),
newest last; ``_Stream.window``: deque of ``Outcome``.
"""

from __future__ import annotations

import statistics
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from extproc.diagnostics.fingerprints import Fingerprints, PromptView

MIN_LOST_BLOCKS = 2  # fewer re-matching blocks after a divergence is chance (shared boilerplate), not a span
_CANDIDATES = 4  # recent requests with the longest common prefix that the re-alignment is tried against


class StreamKey(NamedTuple):
    model: str
    tenant: str  # a tenant class, never a raw tenant id (bounded label set)


@dataclass(frozen=True, slots=True)
class StabilitySettings:
    """See ``config.DiagnosticsConfig`` (the one home of the defaults)."""

    recent_requests: int  # per stream, compared against
    memory_bytes: int  # all streams' stored fingerprints together
    max_span_tokens: int  # a varying span longer than this is not "short": not reported
    max_shift_tokens: int  # how much the span's length may differ between two requests
    window_requests: int  # recent outcomes per stream the report is built from
    min_share: float  # reported when at least this share of the window has a varying span ...
    min_findings: int  # ... and at least this many requests do
    plot_blocks: int  # per-block repeat rates kept for the first this-many blocks


@dataclass(frozen=True, slots=True)
class MessageRef:
    """Which chat message a token offset falls in (index in ``messages``, its role), when known."""

    index: int
    role: str


@dataclass(frozen=True, slots=True)
class Span:
    offset_tokens: int  # first token that differs from the best recent match (granule precision)
    length_tokens: int  # until the content matches again
    message: MessageRef | None


@dataclass(frozen=True, slots=True)
class Outcome:
    """One request diagnosed: its blocks, those prefix caching can hit, and those a stable span would add."""

    prompt_blocks: int
    cached_blocks: int
    lost_blocks: int
    span: Span | None
    repeat_from_block: int = 0  # [repeat_from_block, repeat_to_block): content repeats after the divergence
    repeat_to_block: int = 0


class _Run(NamedTuple):
    resume_token: int  # in the request's own offsets
    end_token: int


@dataclass(frozen=True, slots=True)
class StreamReport:
    """A stream's diagnosis: cumulative counters (metrics) and the window's summary (report, gauges)."""

    key: StreamKey
    block_size: int
    diagnosed: int  # cumulative: requests diagnosed
    varying: int  # cumulative: of those, with a varying span
    prompt_blocks: int  # cumulative
    lost_blocks: int  # cumulative
    window: int  # outcomes in the window
    window_varying: int
    cached_share: float  # of the window's prompt blocks, those prefix caching can hit
    lost_share: float  # of the window's prompt blocks, those a stable span would add
    span: Span | None  # the window's typical span, when reported
    span_offsets: tuple[int, int] | None  # its offsets' range (min, max)
    seen: tuple[int, ...]  # [block] -> requests with that block (first plot_blocks)
    cached: tuple[int, ...]  # [block] -> of those, prefix-cached
    repeated: tuple[int, ...]  # [block] -> of those, content repeating (cached, or re-matched after the span)

    @property
    def reported(self) -> bool:
        return self.span is not None


@dataclass
class _Stream:
    block_size: int
    plot_blocks: int
    recent: deque[Fingerprints] = field(default_factory=deque)
    window: deque[Outcome] = field(default_factory=deque)
    diagnosed: int = 0
    varying: int = 0
    prompt_blocks: int = 0
    lost_blocks: int = 0
    bytes: int = 0
    seen: npt.NDArray[np.int64] = field(init=False)
    cached: npt.NDArray[np.int64] = field(init=False)
    repeated: npt.NDArray[np.int64] = field(init=False)

    def __post_init__(self) -> None:
        self.seen, self.cached, self.repeated = (np.zeros(self.plot_blocks, dtype=np.int64) for _ in range(3))

    def count(self, outcome: Outcome, window: int) -> None:
        self.diagnosed += 1
        self.varying += outcome.span is not None
        self.prompt_blocks += outcome.prompt_blocks
        self.lost_blocks += outcome.lost_blocks
        self.window.append(outcome)
        while len(self.window) > window:
            self.window.popleft()
        p = self.plot_blocks
        self.seen[: min(outcome.prompt_blocks, p)] += 1
        self.cached[: min(outcome.cached_blocks, p)] += 1
        self.repeated[: min(outcome.cached_blocks, p)] += 1
        self.repeated[min(outcome.repeat_from_block, p) : min(outcome.repeat_to_block, p)] += 1


class PrefixStability:
    """The detector. ``observe`` per diagnosed request; ``reports`` at scrape or report time. Not thread-safe:
    one owner (the event loop, or the ``diagnose`` command)."""

    def __init__(self, settings: StabilitySettings) -> None:
        self._settings = settings
        self._streams: dict[StreamKey, _Stream] = {}
        self._bytes = 0

    def observe(
        self,
        key: StreamKey,
        view: PromptView,
        block_size: int,
        locate: Callable[[int], MessageRef | None] | None = None,
    ) -> Outcome:
        """Diagnose one request against the stream's recent ones, then remember it. ``locate`` maps a token
        offset to its message; it is called only when a span is found."""
        stream = self._streams.get(key)
        if stream is None:
            stream = self._streams[key] = _Stream(block_size, self._settings.plot_blocks)
        fps = view.granules(0)
        fps = fps if fps is not None else np.zeros(0, dtype=np.uint64)
        outcome = self._diagnose(stream, view, fps, block_size, locate)
        stream.count(outcome, self._settings.window_requests)
        self._remember(stream, fps)
        return outcome

    def _diagnose(
        self,
        stream: _Stream,
        view: PromptView,
        fps: Fingerprints,
        block_size: int,
        locate: Callable[[int], MessageRef | None] | None,
    ) -> Outcome:
        g = view.granule_tokens
        prompt_blocks = view.tokens // block_size
        common, candidates = _longest_common(stream.recent, fps)
        cached = min(common * g // block_size, prompt_blocks)
        run = self._realign(view, candidates, common)
        if run is None:
            return Outcome(prompt_blocks, cached, 0, None)
        end_block = min(run.end_token // block_size, prompt_blocks)
        lost = max(end_block - cached, 0)
        repeat_from = -(-run.resume_token // block_size)
        span = None
        if lost >= MIN_LOST_BLOCKS and run.resume_token - common * g <= self._settings.max_span_tokens + g:
            offset = common * g
            span = Span(offset, run.resume_token - offset, locate(offset) if locate else None)
        return Outcome(prompt_blocks, cached, lost if span else 0, span, repeat_from, end_block)

    def _realign(self, view: PromptView, candidates: list[Fingerprints], common: int) -> _Run | None:
        """The longest run of a candidate's content found again after the divergence (granule ``common``),
        re-cutting the request at shifts of up to ``max_shift_tokens``; None if none resumes in the window."""
        g, s_max = view.granule_tokens, self._settings.max_shift_tokens
        look = self._settings.max_span_tokens // g + 2  # granules searched for the content to resume
        first = common + 1  # the divergent granule itself never matches
        best: _Run | None = None
        candidates = [q for q in candidates if q.size > first]  # those with content after the divergence
        for shift in range(-s_max, s_max + 1) if candidates else ():
            window = view.granules(first * g + shift, look)
            if window is None or window.size == 0:
                continue  # this shift cannot be cut (a trace), or is past the request's end
            rest: Fingerprints | None = None
            for q in candidates:
                theirs = q[first : first + window.size]
                hits = np.flatnonzero(window[: theirs.size] == theirs)
                if not hits.size:
                    continue
                if rest is None:
                    rest = view.granules(first * g + shift)
                assert rest is not None  # the window at the same offset could be cut
                j = int(hits[0])  # resume granule, counted from ``first``
                mine, theirs = rest[j:], q[first + j :]
                m = min(mine.size, theirs.size)
                miss = np.flatnonzero(mine[:m] != theirs[:m])
                run_len = int(miss[0]) if miss.size else m
                resume = (first + j) * g + shift
                found = _Run(resume, resume + run_len * g)
                if best is None or found.end_token > best.end_token:
                    best = found
        return best

    def _remember(self, stream: _Stream, fps: Fingerprints) -> None:
        stream.recent.append(fps)
        stream.bytes += fps.nbytes
        self._bytes += fps.nbytes
        while len(stream.recent) > self._settings.recent_requests:
            self._forget_oldest(stream)
        while self._bytes > self._settings.memory_bytes:
            self._forget_oldest(max(self._streams.values(), key=lambda s: s.bytes))

    def _forget_oldest(self, stream: _Stream) -> None:
        old = stream.recent.popleft()
        stream.bytes -= old.nbytes
        self._bytes -= old.nbytes

    @property
    def stored_bytes(self) -> int:
        """Bytes of fingerprints held, all streams (bounded by ``memory_bytes``)."""
        return self._bytes

    def reports(self) -> list[StreamReport]:
        """Every stream's report, sorted by key (cheap: the window is bounded)."""
        return [self._report(key, s) for key, s in sorted(self._streams.items())]

    def _report(self, key: StreamKey, s: _Stream) -> StreamReport:
        spans = [o.span for o in s.window if o.span is not None]
        blocks = sum(o.prompt_blocks for o in s.window) or 1
        cfg = self._settings
        reported = len(spans) >= cfg.min_findings and len(spans) >= cfg.min_share * len(s.window)
        offsets = [x.offset_tokens for x in spans]
        return StreamReport(
            key=key, block_size=s.block_size, diagnosed=s.diagnosed, varying=s.varying,
            prompt_blocks=s.prompt_blocks, lost_blocks=s.lost_blocks, window=len(s.window),
            window_varying=len(spans), cached_share=sum(o.cached_blocks for o in s.window) / blocks,
            lost_share=sum(o.lost_blocks for o in s.window) / blocks,
            span=typical_span(spans) if reported else None,
            span_offsets=(min(offsets), max(offsets)) if reported else None,
            seen=tuple(int(x) for x in s.seen), cached=tuple(int(x) for x in s.cached),
            repeated=tuple(int(x) for x in s.repeated),
        )  # fmt: skip


def typical_span(spans: Iterable[Span]) -> Span:
    """The most common message (ties: the earliest), with the median offset and length of its spans."""
    spans = list(spans)
    messages = Counter(s.message for s in spans)
    top = max(messages.items(), key=lambda kv: (kv[1], kv[0] is not None, -(kv[0].index if kv[0] else 0)))[0]
    mine = [s for s in spans if s.message == top]
    offset = int(statistics.median_low(s.offset_tokens for s in mine))
    length = int(statistics.median_low(s.length_tokens for s in mine))
    return Span(offset, length, top)


def _longest_common(recent: Iterable[Fingerprints], fps: Fingerprints) -> tuple[int, list[Fingerprints]]:
    """(the longest common granule prefix of ``fps`` with any recent request, the newest few that share it)."""
    best, candidates = 0, []
    for q in reversed(list(recent)):  # newest first
        m = min(q.size, fps.size)
        miss = np.flatnonzero(q[:m] != fps[:m])
        common = int(miss[0]) if miss.size else m
        if common > best:
            best, candidates = common, [q]
        elif common == best and len(candidates) < _CANDIDATES:
            candidates.append(q)
    return best, candidates
