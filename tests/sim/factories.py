"""Small builders for engine-level tests (no HTTP)."""

from __future__ import annotations

from itertools import count

from vllm_sim.hashing import DEFAULT_NONE_HASH_SEED, BlockHasher, LoraKey
from vllm_sim.kv_cache import BlockPool, KVCacheManager
from vllm_sim.request import OutputStream, SimRequest
from vllm_sim.scheduler import Scheduler, SchedulerConfig

EOS = 151645
FILLER = (576, 3974, 13876)
_ids = count()


def make_request(
    tokens: list[int],
    output_len: int = 4,
    lora: LoraKey | None = None,
    salt: str | None = None,
    arrival_s: float = 0.0,
) -> SimRequest:
    return SimRequest(
        request_id=f"r{next(_ids)}",
        prompt_token_ids=list(tokens),
        output_len=output_len,
        eos_at_end=False,
        lora=lora,
        cache_salt=salt,
        arrival_s=arrival_s,
        sink=OutputStream(),
        filler=FILLER,
        eos_token_id=EOS,
    )


def make_scheduler(
    num_blocks: int = 64,
    block_size: int = 4,
    max_num_seqs: int = 8,
    budget: int = 64,
    max_model_len: int = 200,
    caching: bool = True,
    max_loras: int = 1,
) -> Scheduler:
    pool = BlockPool(num_blocks, block_size, enable_caching=caching, record_events=True)
    hasher = BlockHasher("sha256", DEFAULT_NONE_HASH_SEED, block_size) if caching else None
    return Scheduler(SchedulerConfig(max_num_seqs, budget, max_loras), KVCacheManager(pool, max_model_len), hasher)


def run_to_completion(sched: Scheduler, max_steps: int = 1000) -> int:
    """Run steps until idle; returns the number of steps."""
    for step_no in range(max_steps):
        if not sched.has_work():
            return step_no
        sched.update(sched.schedule(), float(step_no))
    raise AssertionError("scheduler did not drain")
