"""The client side of vLLM's KV-event replay socket (a ROUTER on the engine), for the subscriber.

A DEALER (not REQ: a REQ socket accepts only the first of many replies) sends ``[b"", start_seq8]`` and reads
one reply per buffered batch with ``seq >= start`` until the end marker. Frame layouts live in ``events.py``.
The engine keeps only its last ``buffer_steps`` batches: the first replayed seq tells whether the history
asked for is still all there.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import zmq
import zmq.asyncio

from extproc.kvcache.events import EventDecodeError, ReplayItem, parse_replay_reply, replay_request

log = logging.getLogger(__name__)


async def fetch(
    ctx: zmq.asyncio.Context,
    address: str,
    start: int,
    *,
    until: int | None,
    timeout_s: float,
    max_batches: int,
) -> list[ReplayItem] | None:
    """Batches from ``start`` in order, up to the end marker or (when given) the one before ``until``.

    Returns None on timeout, a protocol error, or more than ``max_batches`` replies. Never raises.
    """
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    items: list[ReplayItem] = []
    try:
        dealer.connect(address)
        async with asyncio.timeout(timeout_s):
            await dealer.send_multipart(replay_request(start))
            while len(items) < max_batches:
                item = parse_replay_reply(await dealer.recv_multipart())
                if item is None:
                    return items
                items.append(item)
                if until is not None and item.seq >= until - 1:
                    return items  # up to the live message: the rest comes through the SUB
        return None
    except (TimeoutError, EventDecodeError, zmq.ZMQError) as exc:
        log.warning("kv events: replay from %s at %d failed: %r", address, start, exc)
        return None
    finally:
        dealer.close(linger=0)


def contiguous_tail(items: Sequence[ReplayItem], until: int | None = None) -> list[ReplayItem]:
    """The longest run of consecutive seqs ending at ``until - 1`` (or at the last item when ``until`` is None).

    Applying only a tail of an engine's history never invents a block it does not hold (a block stored in the
    tail and not removed after is still there), so a tail is safe to apply even when its start is missing.
    """
    kept = [i for i in items if until is None or i.seq < until]
    if not kept or (until is not None and kept[-1].seq != until - 1):
        return []
    first = len(kept) - 1
    while first > 0 and kept[first - 1].seq == kept[first].seq - 1:
        first -= 1
    return kept[first:]
