"""Fixtures for the kvcache tests: the same real valkey-server fixture the contract suite uses."""

from tests.contract.conftest import valkey_url

__all__ = ["valkey_url"]
