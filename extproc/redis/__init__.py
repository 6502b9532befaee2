"""Redis, behind one seam: everything the router keeps in Redis or Valkey, and the only package that knows how.

* ``client``: the client factory (plain or Cluster URLs) and the deadline -> "unavailable" mapping.
* ``schema``: every key name (prefix index, leases, stream positions, shared load).
* ``scripts`` + ``lua/*.lua``: the server-side scripts, shipped as package data.
* ``prefix_index``: the shared ``PrefixIndex`` (fenced writes for the event streams).
* ``leases``: which replica applies each endpoint's KV events (``kvcache.gate.WriteGate``), with fencing.
* ``shared_load``: the in-flight prefill queues every replica adds to (versioned: reserve-if-unchanged).

The leases and the index share knowledge only through ``schema`` (the lease key and its ``token`` field, which
the index's write scripts check), never through each other's internals.
"""
