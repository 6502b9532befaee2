"""The scheduling profile the validated config describes: the only place profile parameters get their values.

The profiles and the estimator have no defaults of their own, so a default lives only in ``extproc/config.py``
and cannot drift (``stickiness_s`` once did: 0.05 in the profile, 0.2 in the config).
"""

from __future__ import annotations

from extproc.config import DEFAULT_CLASS, SchedulingConfig, TenantClass, TenantsConfig, TtftProfileConfig
from extproc.scheduling.estimate import EstimatorParams
from extproc.scheduling.pd import PdPolicy
from extproc.scheduling.profiles import Profile, TtftProfile, WeightedProfile
from extproc.scheduling.tenant_shares import ClassShare, SharePolicy


def build_profile(scheduling: SchedulingConfig, tenants: TenantsConfig | None = None) -> Profile:
    """``scheduling.profile`` as a ``Profile``, with the settings every profile shares; ``tenants``: their cache
    shares (the TTFT profile applies them; the weighted one does not)."""
    p = scheduling.profile
    if not isinstance(p, TtftProfileConfig):
        return WeightedProfile(weights=dict(p.weights), fallbacks=scheduling.fallbacks)
    return TtftProfile(
        params=estimator_params(scheduling),
        stickiness_s=p.stickiness_s,
        min_prefix_share=p.min_prefix_share,
        tie_epsilon_s=p.tie_epsilon_s,
        fallbacks=scheduling.fallbacks,
        shed_ttft_s=scheduling.shed_ttft_s,
        shares=share_policy(tenants or TenantsConfig()),
        copy_into_full_kv=p.copy_into_full_kv,
    )


def build_pd(scheduling: SchedulingConfig) -> PdPolicy:
    """``scheduling.pd`` as the P/D policy; its estimates use the TTFT profile's constants (the defaults' when the
    profile is weighted)."""
    pd = scheduling.pd
    return PdPolicy(
        params=estimator_params(scheduling),
        non_cached_tokens=pd.non_cached_tokens,
        max_extra_ttft_s=pd.max_extra_ttft_s,
        kv_transfer_s_per_token=pd.kv_transfer_s_per_token,
        kv_transfer_setup_s=pd.kv_transfer_setup_s,
    )


def estimator_params(scheduling: SchedulingConfig) -> EstimatorParams:
    """The configured estimate's constants (the TTFT profile's, or the defaults' when the profile is weighted);
    also the prior the cost model learns from (``app.py``)."""
    p = scheduling.profile if isinstance(scheduling.profile, TtftProfileConfig) else TtftProfileConfig()
    return EstimatorParams(
        prefill_tokens_per_s=scheduling.prefill_tokens_per_s,
        decode_slowdown_per_running=p.decode_slowdown_per_running,
        request_overhead_s=p.request_overhead_s,
        kv_pressure_threshold=p.kv_pressure_threshold,
        kv_penalty_s=p.kv_penalty_s,
        unknown_load_penalty_s=p.unknown_load_penalty_s,
    )


def share_policy(tenants: TenantsConfig) -> SharePolicy:
    """Every class's cache policy, by the class names ``TenantResolver`` gives (``Tenant.cls``)."""
    classes = {name: _share(c) for name, c in tenants.classes.items()}
    if DEFAULT_CLASS not in classes:
        classes[DEFAULT_CLASS] = _share(tenants.default)
    return SharePolicy(classes=classes, default=_share(tenants.default))


def _share(c: TenantClass) -> ClassShare:
    return ClassShare(c.cache_share, c.cache_share_of == "endpoint", c.protect_hot_prefixes)
