"""Shared test helpers: free ports (``ports``) and a real-Envoy harness (``envoy``)."""
