"""The step-time model: how long one engine step takes on the simulated GPU.

A step runs some prefill chunks and some decode tokens together (vLLM v1's unified batch). Its duration is

    step_s = decode_step_s                                   # fixed: weights streamed once + CPU/launch
    overhead
           + prefill_tokens / prefill_tokens_per_s           # GEMMs of new prompt tokens (compute bound)
           + prefill_attn_pairs * attn_pair_s                # causal attention of new tokens over their
           context
           + decode_seqs * decode_per_seq_s                  # growth with batch size (GEMM work per extra
           token)
           + decode_ctx_tokens * kv_read_per_token_s         # KV cache read by each decode token

Profiles are derived by roofline from public spec-sheet numbers; the derivation of ``h100-llama3-8b`` is in
its
docstring-like ``source`` field and in docs/simulator.md. They are estimates, not measurements.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class StepCost:
    """The work of one step, as the scheduler planned it."""

    prefill_tokens: int = 0
    prefill_attn_pairs: int = 0
    decode_seqs: int = 0
    decode_ctx_tokens: int = 0


@dataclass(frozen=True, slots=True)
class TimingProfile:
    """Coefficients of the step-time model (seconds, tokens); see the module docstring for the formula."""

    name: str
    decode_step_s: float
    prefill_tokens_per_s: float
    attn_pair_s: float
    decode_per_seq_s: float
    kv_read_per_token_s: float
    kv_capacity_tokens: int
    source: str = ""

    def step_time_s(self, cost: StepCost) -> float:
        """Duration of one step doing ``cost``; 0 for an empty step."""
        if cost.prefill_tokens == 0 and cost.decode_seqs == 0:
            return 0.0
        return (
            self.decode_step_s
            + cost.prefill_tokens / self.prefill_tokens_per_s
            + cost.prefill_attn_pairs * self.attn_pair_s
            + cost.decode_seqs * self.decode_per_seq_s
            + cost.decode_ctx_tokens * self.kv_read_per_token_s
        )

    def with_overrides(
        self,
        prefill_tokens_per_s: float | None = None,
        decode_step_s: float | None = None,
        decode_per_seq_s: float | None = None,
    ) -> TimingProfile:
        """A copy with the given coefficients replaced (None keeps the profile's value)."""
        return replace(
            self,
            prefill_tokens_per_s=prefill_tokens_per_s or self.prefill_tokens_per_s,
            decode_step_s=self.decode_step_s if decode_step_s is None else decode_step_s,
            decode_per_seq_s=self.decode_per_seq_s if decode_per_seq_s is None else decode_per_seq_s,
        )


# Llama-3-8B: 8.03e9 params, 32 layers, hidden 4096, 8 KV heads x 128 dims, BF16.
# H100 SXM spec sheet: 989 TFLOPS dense BF16, 3.35 TB/s HBM3, 80 GB.
# Assumptions (ours, not measured): 50% MFU in GEMMs and attention, 80% of peak HBM bandwidth, 1 ms per-step
# CPU/launch overhead, 54 GB left for KV after weights and activations at gpu_memory_utilization 0.9.
_LLAMA3_8B_FLOP_PER_TOKEN = 2 * 8.03e9  # 16.06 GFLOP
_ATTN_FLOP_PER_PAIR = 4 * 4096 * 32  # QK^T + AV, per layer hidden 4096, 32 layers
_H100_EFF_FLOPS = 0.5 * 989e12
_H100_EFF_BW = 0.8 * 3.35e12
_KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2  # K and V, 32 layers, 8 KV heads, 128 dims, 2 bytes = 128 KiB

H100_LLAMA3_8B = TimingProfile(
    name="h100-llama3-8b",
    decode_step_s=1e-3 + 2 * 8.03e9 / _H100_EFF_BW,  # 1 ms + 16.06 GB / 2.68 TB/s = ~7.0 ms
    prefill_tokens_per_s=_H100_EFF_FLOPS / _LLAMA3_8B_FLOP_PER_TOKEN,  # ~30,800 tokens/s
    attn_pair_s=_ATTN_FLOP_PER_PAIR / _H100_EFF_FLOPS,  # ~1.06 ns per (query, key) pair
    decode_per_seq_s=_LLAMA3_8B_FLOP_PER_TOKEN / _H100_EFF_FLOPS,  # ~32 us per extra sequence in the batch
    kv_read_per_token_s=_KV_BYTES_PER_TOKEN / _H100_EFF_BW,  # ~49 ns per context token per decode
    kv_capacity_tokens=int(54e9 // _KV_BYTES_PER_TOKEN),  # ~412k tokens
    source="roofline from H100 SXM spec sheet (989 TFLOPS BF16, 3.35 TB/s) and Llama-3-8B shapes; "
    "assumed 50% MFU, 80% bandwidth, 1 ms step overhead",
)

FAST = TimingProfile(
    name="fast",
    decode_step_s=1e-3,
    prefill_tokens_per_s=2e6,
    attn_pair_s=0.0,
    decode_per_seq_s=1e-6,
    kv_read_per_token_s=0.0,
    kv_capacity_tokens=65_536,
    source="for tests: 1 ms steps, 2M prompt tokens/s",
)

PROFILES: dict[str, TimingProfile] = {p.name: p for p in (H100_LLAMA3_8B, FAST)}
DEFAULT_PROFILE = H100_LLAMA3_8B.name


def get_profile(name: str) -> TimingProfile:
    """The named profile; raises ValueError listing the known names."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown timing profile {name!r}; known: {', '.join(PROFILES)}") from None
