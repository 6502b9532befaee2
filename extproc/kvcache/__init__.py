"""Prefix blocks: vLLM-identical hashing, the PrefixIndex interface and its backends, vLLM KV-event ingest."""
