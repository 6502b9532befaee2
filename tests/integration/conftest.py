"""Fixtures for the integration tests: the real servers the contract suite uses (Valkey 9, and Redis 7 where present)."""

from tests.contract.conftest import redis7_url, server_url, valkey_url

__all__ = ["redis7_url", "server_url", "valkey_url"]
