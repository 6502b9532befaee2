"""Apply one endpoint's decoded KV events to a ``PrefixIndex``, with the self-check that earns them trust.

Called by the subscriber, per endpoint, strictly in sequence order (one coroutine per endpoint, so calls for
one endpoint never overlap). Writes only through ``IndexWrites`` (any ``PrefixIndex``, or the leases' fenced
view of the shared one), so it works on every backend. ``apply`` and ``purge`` return an ``Outcome``: the
subscriber commits a stream's position only on ``APPLIED``.

A real purge (start, reconnect, restart, unreplayable gap, removal) and an ``AllBlocksCleared`` also clear the
endpoint's *approximate* entries (``approx``): a restarted engine holds nothing, and neither our guesses nor
our burst marks may outlive that. A purge that only retries one the index could not take does not: the
engine's cache did not change, and the guesses made while the index was down are still our best knowledge.
The approximate index is cleared first, so a real purge clears our guesses even while the precise one is down.

What is indexed: GPU-tier (``medium`` None or ``"GPU"``), full-attention (``kind`` None or
``"full_attention"``) blocks. Offload tiers (CPU/STORAGE) and other KV groups (sliding window, Mamba) are
counted and ignored for now; weighting tiers (llm-d scores CPU hits at 0.8) is left to do. A ``BlockRemoved``
naming a group other than the endpoint's full-attention group (learnt from its stores) is ignored too, since
vLLM reports the same hash once per group.

Self-check (SPEC §2.7): a ``BlockStored`` whose ``parent`` is None, whose ``extra_keys`` are all None (or
absent) and that has no lookahead hashing can be recomputed from its own ``token_ids`` with the endpoint's
``HashScheme``. The first ``_SELFCHECK_BLOCKS`` blocks are compared (enough to catch seed, algorithm, block
size or version drift; bounded CPU on the event loop). A mismatch counts, logs one line and makes the
endpoint **untrusted**: its stores are skipped (our request keys would never match them) until a later
self-check passes. Endpoints start trusted: the first uncached request after a (re)start self-checks at once.

Cold: an endpoint is cold after a ``purge`` (start, reconnect, restart, unrecoverable gap) or an
``AllBlocksCleared``, until a store lands again: the router should not read "no prefix anywhere" as a fact.

Index failures (``IndexUnavailable``) lose writes, so the endpoint is marked for a purge that is retried
before its next batch is applied; until it succeeds the endpoint stays cold.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass

from extproc.kvcache.events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, KvEvent
from extproc.kvcache.gate import IndexWrites
from extproc.kvcache.hashing import BlockHasher
from extproc.kvcache.index import Chain, GuessIndex, IndexUnavailable
from extproc.types import BlockHash, EndpointId, HashScheme

log = logging.getLogger(__name__)

_SELFCHECK_BLOCKS = 4  # leading blocks recomputed per self-check
_GPU = "GPU"
_FULL_ATTENTION = "full_attention"


@dataclass
class IngestCounters:
    """Totals over every endpoint since start (plain ints; exported to Prometheus by the owner)."""

    batches: int = 0
    events: int = 0
    unknown_events: int = 0
    ignored_events: int = 0  # other tiers / KV groups
    untrusted_skips: int = 0  # stores skipped while their endpoint was untrusted
    blocks_stored: int = 0
    blocks_removed: int = 0
    clears: int = 0  # AllBlocksCleared applied
    purges: int = 0  # clears we decided on (start, reconnect, restart, gap, index failure)
    selfchecks: int = 0
    selfcheck_mismatches: int = 0
    index_errors: int = 0


class Outcome(enum.Enum):
    """What became of a batch or a purge in the index."""

    APPLIED = "applied"  # every write reached the index (or there was none to make)
    SKIPPED = "skipped"  # some writes were not this replica's to make (another replica's lease)
    WRITE_LOST = "write_lost"  # the index did not answer: a purge is retried before the next batch


@dataclass(frozen=True, slots=True)
class IngestStatus:
    """What ingest knows about one endpoint's entries, for the subscriber's ``status``."""

    trusted: bool  # its hashes passed the self-check (or were never contradicted)
    cold: bool  # purged or cleared and not refilled yet


@dataclass
class _EndpointState:
    trusted: bool = True
    cold: bool = True
    needs_purge: bool = False
    full_attention_group: int | None = None
    blocks_stored: int = 0  # this endpoint's share of IngestCounters.blocks_stored
    blocks_removed: int = 0


_Segments = list[tuple[int, BlockHash | None]]  # a store's Chain segments: (first index, parent)
_Op = tuple[str, list[BlockHash], _Segments | None]  # ("store" | "remove" | "clear", hashes, chain or None)


class Ingest:
    """Applies event batches to ``index``; ``scheme_for(endpoint)``: its HashScheme (None: no self-check)."""

    def __init__(
        self,
        index: IndexWrites,
        scheme_for: Callable[[EndpointId], HashScheme | None],
        *,
        approx: GuessIndex | None = None,
    ) -> None:
        """``approx``: our own guesses about the same endpoints, cleared by real purges (module docstring)."""
        self.index = index
        self.approx = approx
        self.scheme_for = scheme_for
        self.counters = IngestCounters()
        self._states: dict[EndpointId, _EndpointState] = {}
        self._hashers: dict[HashScheme, BlockHasher | None] = {}  # None: scheme not reproducible here

    def status(self, endpoint: EndpointId) -> IngestStatus:
        """Whether ``endpoint``'s hashes are trusted and whether it is cold (an unseen one: trusted, cold)."""
        st = self._states.get(endpoint)
        return IngestStatus(True, True) if st is None else IngestStatus(st.trusted, st.cold)

    def block_totals(self, endpoint: EndpointId) -> tuple[int, int]:
        """``(blocks stored, blocks removed)`` applied for ``endpoint`` since it was first seen (or forgotten)."""
        st = self._states.get(endpoint)
        return (0, 0) if st is None else (st.blocks_stored, st.blocks_removed)

    def _state(self, endpoint: EndpointId) -> _EndpointState:
        st = self._states.get(endpoint)
        if st is None:
            st = self._states[endpoint] = _EndpointState()
        return st

    def forget(self, endpoint: EndpointId) -> None:
        """Drop the state of an endpoint that left the pool (its index entries are the caller's to clear)."""
        self._states.pop(endpoint, None)

    async def purge(self, endpoint: EndpointId, reason: str) -> Outcome:
        """The engine's cache is gone or unknown: clear ``endpoint`` in both indexes and mark it cold.
        ``WRITE_LOST``: the index is down, the purge is retried before the next batch; ``SKIPPED``: another
        replica writes the shared index for it (its purge is that replica's)."""
        return await self._purge(endpoint, reason, retry=False)

    async def _purge(self, endpoint: EndpointId, reason: str, *, retry: bool) -> Outcome:
        st = self._state(endpoint)
        st.cold = True
        self.counters.purges += 1
        try:
            written = await self._clear(endpoint, guesses=not retry)
        except IndexUnavailable as exc:
            self.counters.index_errors += 1
            st.needs_purge = True
            log.warning("kv ingest: purge of %s (%s) failed, will retry: %s", endpoint, reason, exc)
            return Outcome.WRITE_LOST
        st.needs_purge = False
        log.info("kv ingest: purged %s (%s%s)", endpoint, reason, "" if written else "; another replica writes it")
        return Outcome.APPLIED if written else Outcome.SKIPPED

    async def _clear(self, endpoint: EndpointId, *, guesses: bool) -> bool:
        """Clear the precise index (and, with ``guesses``, the approximate one first); False when skipped."""
        if guesses and self.approx is not None:
            await self.approx.clear(endpoint)
        return await self.index.clear(endpoint) is not False

    def mark_complete(self, endpoint: EndpointId) -> None:
        """The endpoint's whole event history has been applied (a bootstrap replay from seq 0): its entries
        are exact, even if there are none, so it is not cold (unless index writes failed on the way)."""
        st = self._state(endpoint)
        if not st.needs_purge:
            st.cold = False

    async def apply(self, endpoint: EndpointId, batch: EventBatch) -> Outcome:
        """Apply one batch in order. Never raises for index failures (they schedule a purge instead:
        ``WRITE_LOST``)."""
        st = self._state(endpoint)
        self.counters.batches += 1
        self.counters.events += len(batch.events)
        self.counters.unknown_events += batch.unknown_events
        outcome = Outcome.APPLIED
        if st.needs_purge:
            outcome = await self._purge(endpoint, "retry after index failure", retry=True)
            if outcome is Outcome.WRITE_LOST:
                return outcome
        ops = self._plan(endpoint, st, batch.events)
        try:
            for kind, hashes, segments in ops:
                if not await self._run(endpoint, st, kind, hashes, segments):
                    outcome = Outcome.SKIPPED
        except IndexUnavailable as exc:
            self.counters.index_errors += 1
            st.needs_purge, st.cold = True, True
            log.warning("kv ingest: index unavailable while applying %s's events: %s", endpoint, exc)
            return Outcome.WRITE_LOST
        return outcome

    # -- internals -----------------------------------------------------------------------------------------

    def _plan(self, endpoint: EndpointId, st: _EndpointState, events: tuple[KvEvent, ...]) -> list[_Op]:
        """Filter and self-check the events, coalescing runs of stores / removes into one index call each."""
        ops: list[_Op] = []
        for ev in events:
            if isinstance(ev, AllBlocksCleared):
                ops.append(("clear", [], None))
                continue
            op = self._stored(endpoint, st, ev) if isinstance(ev, BlockStored) else self._removed(st, ev)
            if op is None:
                continue
            if ops and ops[-1][0] == op[0]:
                kind, hashes, segments = ops[-1]
                if segments is not None and op[2] is not None:
                    segments.extend((len(hashes) + start, parent) for start, parent in op[2])
                else:
                    segments = None  # one part without a chain: claim none for the call
                hashes.extend(op[1])  # in place: a batch of many events is not copied again per event
                ops[-1] = (kind, hashes, segments)
            else:
                ops.append(op)
        return ops

    def _stored(self, endpoint: EndpointId, st: _EndpointState, ev: BlockStored) -> _Op | None:
        if ev.medium not in (None, _GPU) or ev.kind not in (None, _FULL_ATTENTION):
            self.counters.ignored_events += 1
            return None
        if ev.kind == _FULL_ATTENTION and ev.group_idx is not None:
            st.full_attention_group = ev.group_idx
        self._maybe_selfcheck(endpoint, st, ev)
        if not st.trusted:
            self.counters.untrusted_skips += 1
            return None
        # A chain claim (``Chain``): the hashes are consecutive blocks after ``parent``, unless some were
        # skipped (masked hybrid blocks) or the event is a placeholder without token ids.
        whole = ev.block_size > 0 and len(ev.token_ids) == len(ev.block_hashes) * ev.block_size
        segments = [(0, None if ev.parent is None else BlockHash(ev.parent))] if whole else None
        return ("store", [BlockHash(h) for h in ev.block_hashes], segments)

    def _removed(self, st: _EndpointState, ev: BlockRemoved) -> _Op | None:
        other_group = (
            ev.group_idx is not None and st.full_attention_group is not None and ev.group_idx != st.full_attention_group
        )
        if ev.medium not in (None, _GPU) or other_group:
            self.counters.ignored_events += 1
            return None
        return ("remove", [BlockHash(h) for h in ev.block_hashes], None)

    def _maybe_selfcheck(self, endpoint: EndpointId, st: _EndpointState, ev: BlockStored) -> None:
        if ev.parent is not None or ev.lookahead or not ev.block_hashes:
            return
        if ev.extra_keys is not None and any(k is not None for k in ev.extra_keys):
            return
        scheme = self.scheme_for(endpoint)
        hasher = None if scheme is None else self._hasher(scheme)
        if scheme is None or hasher is None or len(ev.token_ids) != len(ev.block_hashes) * ev.block_size:
            return  # no usable scheme, or token_ids do not span the blocks 1:1 (masked/hybrid groups)
        n = min(len(ev.block_hashes), _SELFCHECK_BLOCKS)
        ours = hasher.hash_blocks(ev.token_ids[: n * ev.block_size], max_blocks=n)
        theirs = [BlockHash(h) for h in ev.block_hashes[:n]]  # the claim under test
        self.counters.selfchecks += 1
        if ev.block_size == scheme.block_size and ours == theirs:
            if not st.trusted:
                log.info("kv ingest: %s self-check passes again; trusting its events", endpoint)
            st.trusted = True
            return
        self.counters.selfcheck_mismatches += 1
        if st.trusted:
            log.warning(
                "kv ingest: %s self-check MISMATCH (event block_size=%d, ours %s; engine %s vs ours %s): "
                "seed/algo/block size/version drift? using approximate routing for it",
                endpoint, ev.block_size, scheme, theirs[:1], ours[:1],
            )  # fmt: skip
        st.trusted = False

    def _hasher(self, scheme: HashScheme) -> BlockHasher | None:
        if scheme not in self._hashers:
            try:
                self._hashers[scheme] = BlockHasher(scheme)
            except ValueError as exc:  # e.g. xxhash: we cannot reproduce it, so we cannot check it
                log.warning("kv ingest: no self-check for %s: %s", scheme, exc)
                self._hashers[scheme] = None
        return self._hashers[scheme]

    async def _run(
        self, endpoint: EndpointId, st: _EndpointState, kind: str, hashes: list[BlockHash], segments: _Segments | None
    ) -> bool:
        """One coalesced write; False when it was not this replica's to make."""
        if kind == "clear":
            written = await self._clear(endpoint, guesses=True)
            self.counters.clears += 1
            st.cold = True
        elif kind == "store":
            chain = None if segments is None else Chain(tuple(segments))
            written = await self.index.store(endpoint, hashes, chain=chain) is not False
            self.counters.blocks_stored += len(hashes)
            st.blocks_stored += len(hashes)
            st.cold = False
        else:
            written = await self.index.remove(endpoint, hashes) is not False
            self.counters.blocks_removed += len(hashes)
            st.blocks_removed += len(hashes)
        return written
