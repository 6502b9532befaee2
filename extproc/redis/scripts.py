"""The Lua scripts, loaded from ``lua/*.lua`` (package data), with their size constants filled in.

Conventions shared by the prefix index's scripts (``common.lua`` is prepended to each of them):

* Block hashes travel as one blob of 8-byte big-endian values: thousands of separate arguments cost more to
  pack and parse than the lookups themselves. ``upto(j)`` splits the blob lazily into ``F[1..j]``.
* Hashes never become Lua numbers (doubles lose bits above 2**53): they stay 8-byte strings.
* Expiry uses the server's clock (``TIME``); ``live(v)`` says whether a field value is unexpired.
* An entry's value (in ``h:<endpoint>``) is ``<expires-at ms>`` ("0" = never), or, for a **rooted** entry,
  ``<expires-at>|<rooted children>|<parent>``: stored as part of a claimed chain (``Chain``) whose parent was
  itself rooted (or none: a prompt's first block), so every ancestor was held when it was stored; ``parent``
  is 8 raw bytes ('' for a first block), the children count how many rooted entries name it as parent.
  ``u`` counts each endpoint's entries that are not rooted; ``holey`` counts its rooted entries whose parent
  it lost (orphans: +children left behind when a rooted entry goes, -1 when an orphan goes). An endpoint with
  neither is **clean**: each of its entries comes with all its ancestors, so along a prompt's chain what it
  holds is a prefix, and MATCH may bisect. (A parent stored again does not adopt its orphans: they stay
  counted until they go, which only costs bisection, never exactness.)
* The scripts keep their keys in ``K`` (filled from KEYS first), so the shared helpers need no key arguments.
* Fencing (``leases.py``): STORE, REMOVE and CLEAR take the endpoint's lease HASH as their **last key** and a
  fencing token as their **last argument** (``''`` = unfenced). A fenced write whose token is not the lease's
  current one (a deposed owner's, or one whose lease expired) changes nothing and returns -1.
* A holder bitmap is a string, bit ``slot % 8`` of byte ``slot // 8 + 1`` for the endpoint in ``slot``, with
  trailing zero bytes stripped, so equal holder sets are equal (interned, pointer-compared) Lua strings.

Every script names its KEYS and ARGV in its first lines; the key names are ``schema.py``'s.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

CHUNK = 1000  # arguments per multi-field command inside scripts (Lua's unpack() has a stack limit)
RECLAIM_PER_STORE = 256  # expired entries a store drops (soonest first) from the endpoint it writes
DRAIN_PER_MATCH = 256  # ... and a match from each endpoint it reads, before the walk


@cache
def source(name: str) -> str:
    """The text of ``lua/<name>.lua`` as shipped (read once)."""
    return files(__package__).joinpath("lua", f"{name}.lua").read_text(encoding="utf-8")


def index_script(name: str, *, blob_arg: int) -> str:
    """A prefix-index script (``match``, ``store``, ``remove``, ``clear``) with the common helpers, its blob
    argument index and the size constants filled in."""
    text = source("common").replace("ARGV[BLOB]", f"ARGV[{blob_arg}]") + source(name)
    for const, value in (("CHUNK", CHUNK), ("RECLAIM", RECLAIM_PER_STORE), ("DRAIN", DRAIN_PER_MATCH)):
        text = text.replace(const, str(value))
    return text
