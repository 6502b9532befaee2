"""Prefix blocks: vLLM-identical hashing, the PrefixIndex interface and its backends, vLLM KV-event ingest.

Read path: ``hashing`` (token ids -> BlockHash) -> ``PrefixIndex.match`` (``index``; backends
``memory_index``; the Redis one is ``extproc.redis.prefix_index``).

Write path (precise mode): engine PUB -> ``subscriber`` (one ZMQ SUB per endpoint; sequence, gap, replay via
``replay``, restart and reconnect handling) -> ``events`` (the only module that knows vLLM's msgpack) ->
``ingest`` (tier/group filter, self-check trust, coalesced writes, an ``Outcome`` per batch) -> ``gate.IndexWrites``
store/remove/clear. ``feed`` assembles the write path for the app (which translates the config).

Many replicas on one Redis: ``extproc.redis.leases`` (the Redis implementation of ``gate.WriteGate``) lets
exactly one replica write each endpoint's stream, fences a deposed writer inside the write scripts, and stores
the last applied batch so a new writer resumes from it through the engine's replay socket. This package never
imports ``extproc.redis`` or ``extproc.config``.
"""
