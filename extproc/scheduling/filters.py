"""Eligibility filters: which endpoints may serve a request at all."""

from __future__ import annotations

from collections.abc import Iterable

from extproc.types import Endpoint, EndpointId, LoraAdapter


def serves(endpoint: Endpoint, base_model: str, lora: LoraAdapter | None) -> bool:
    """True if ``endpoint`` serves the model (or adapter). Undiscovered model lists count as serving."""
    if endpoint.models and base_model not in endpoint.models:
        return False
    return lora is None or not endpoint.adapters or lora.name in endpoint.adapters


def eligible(
    endpoints: Iterable[Endpoint],
    base_model: str,
    lora: LoraAdapter | None,
    subset: frozenset[EndpointId] | None,
) -> list[Endpoint]:
    """Healthy endpoints that serve the model and lie in the gateway's subset hint (when given)."""
    return [e for e in endpoints if e.healthy and serves(e, base_model, lora) and (subset is None or e.id in subset)]
