"""The scheduling profile the validated config describes: the only place profile parameters get their values.

The profiles and the estimator have no defaults of their own, so a default lives only in ``extproc/config.py``
and cannot drift (``stickiness_s`` once did: 0.05 in the profile, 0.2 in the config).
"""

from __future__ import annotations

from extproc.config import SchedulingConfig, TtftProfileConfig
from extproc.scheduling.estimate import EstimatorParams
from extproc.scheduling.profiles import Profile, TtftProfile, WeightedProfile


def build_profile(scheduling: SchedulingConfig) -> Profile:
    """``scheduling.profile`` as a ``Profile``, with the settings every profile shares."""
    p = scheduling.profile
    if not isinstance(p, TtftProfileConfig):
        return WeightedProfile(weights=dict(p.weights), fallbacks=scheduling.fallbacks)
    params = EstimatorParams(
        prefill_tokens_per_s=scheduling.prefill_tokens_per_s,
        decode_slowdown_per_running=p.decode_slowdown_per_running,
        request_overhead_s=p.request_overhead_s,
        kv_pressure_threshold=p.kv_pressure_threshold,
        kv_penalty_s=p.kv_penalty_s,
        unknown_load_penalty_s=p.unknown_load_penalty_s,
    )
    return TtftProfile(
        params=params,
        stickiness_s=p.stickiness_s,
        min_prefix_share=p.min_prefix_share,
        tie_epsilon_s=p.tie_epsilon_s,
        fallbacks=scheduling.fallbacks,
        shed_ttft_s=scheduling.shed_ttft_s,
        copy_into_full_kv=p.copy_into_full_kv,
    )
