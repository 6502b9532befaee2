"""Resolvers the read path calls per request: a base model → its pool's hash scheme (configured or discovered),
and a tenant id → its class."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from extproc.backends.registry import EndpointRegistry
from extproc.config import DEFAULT_CLASS, ModelConfig, TenantClass, TenantsConfig
from extproc.types import HashScheme, Tenant

DEFAULT_SCHEME = HashScheme()


class SchemeResolver:
    """``HashScheme`` for a base model: configured fields win; missing ones come from the backends'
    ``vllm:cache_config_info`` (block size, algorithm); vLLM's defaults (16, sha256) otherwise."""

    def __init__(self, models: Mapping[str, ModelConfig], registry: EndpointRegistry) -> None:
        self._models = dict(models)
        self._registry = registry

    def __call__(self, base_model: str) -> HashScheme:
        cfg = self._models.get(base_model)
        block_size = cfg.block_size if cfg else None
        algo: str | None = cfg.hash_algo if cfg else None
        if block_size is None or algo is None:
            found_bs, found_algo = self._discovered(base_model)
            block_size = block_size or found_bs
            algo = algo or found_algo
        return HashScheme(
            block_size=block_size or DEFAULT_SCHEME.block_size,
            algo=algo or DEFAULT_SCHEME.algo,
            seed=cfg.hash_seed if cfg else None,
        )

    def _discovered(self, base_model: str) -> tuple[int | None, str | None]:
        for state in self._registry.snapshot().values():
            m = state.metrics
            if m is None or (m.models and base_model not in m.models):
                continue
            if m.block_size or m.hash_algo in ("sha256", "sha256_cbor"):
                algo = m.hash_algo if m.hash_algo in ("sha256", "sha256_cbor") else None
                return m.block_size, algo
        return None, None


class TenantResolver:
    """Tenant id (the fairness header's value) → its configured class, or the default class."""

    def __init__(self, config: TenantsConfig) -> None:
        """Raises ``TypeError`` at boot if a ``TenantClass`` setting has no ``Tenant`` field to go to."""
        self._classes = {tenant_id: _promise(cls) for tenant_id, cls in config.classes.items()}
        self._default = _promise(config.default)

    def __call__(self, tenant_id: str) -> Tenant:
        listed = self._classes.get(tenant_id)
        if listed is None:
            return replace(self._default, id=tenant_id, cls=DEFAULT_CLASS)
        return replace(listed, id=tenant_id, cls=tenant_id)


def _promise(cls: TenantClass) -> Tenant:
    """A class's promises as a ``Tenant``: every ``TenantClass`` field by name, none copied by hand (so a new
    tenant setting cannot silently stay at its default)."""
    return Tenant(id="", **cls.model_dump())
