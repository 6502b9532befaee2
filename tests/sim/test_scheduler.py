"""Continuous batching: token budget, max_num_seqs, chunked prefill, preemption, LoRA limit, step costs."""

from __future__ import annotations

from tests.sim.factories import FILLER, make_request, make_scheduler, run_to_completion
from vllm_sim.hashing import LoraKey
from vllm_sim.timing import FAST, StepCost


def test_budget_chunks_a_long_prefill_across_steps() -> None:
    sched = make_scheduler(block_size=4, budget=16)
    req = make_request(list(range(40)), output_len=2)
    sched.add(req)
    chunks = []
    for t in range(4):
        step = sched.schedule()
        chunks.append([n for _, _, n in step.entries])
        sched.update(step, float(t))
    assert chunks == [[16], [16], [8], [1]]
    assert req.num_output_tokens == 2 and req.finish_reason == "length"


def test_running_requests_are_served_before_waiting_ones_within_the_budget() -> None:
    sched = make_scheduler(block_size=4, budget=10)
    a, b = make_request(list(range(8)), output_len=5), make_request(list(range(100, 120)), output_len=2)
    sched.add(a)
    sched.update(sched.schedule(), 0.0)  # a prefilled, now decoding
    sched.add(b)
    step = sched.schedule()
    assert [(r.request_id, n) for r, _, n in step.entries] == [(a.request_id, 1), (b.request_id, 9)]
    assert step.cost() == StepCost(prefill_tokens=9, prefill_attn_pairs=45, decode_seqs=1, decode_ctx_tokens=9)


def test_max_num_seqs_caps_the_running_set() -> None:
    sched = make_scheduler(block_size=4, max_num_seqs=2)
    reqs = [make_request(list(range(i * 10, i * 10 + 5)), output_len=3) for i in range(3)]
    for r in reqs:
        sched.add(r)
    sched.schedule()
    assert len(sched.running) == 2 and list(sched.waiting) == [reqs[2]]


def test_preemption_frees_the_last_running_request_and_requeues_it_first() -> None:
    sched = make_scheduler(num_blocks=7, block_size=4, budget=64)  # 6 usable blocks
    a, b = make_request(list(range(11)), output_len=8), make_request(list(range(50, 61)), output_len=8)
    sched.add(a)
    sched.add(b)
    for t in range(3):  # both prefilled (3 blocks each), decoding until a needs a 4th block
        sched.update(sched.schedule(), float(t))
    assert b in sched.waiting and b.num_computed_tokens == 0 and b.block_ids == []
    assert sched.stats.num_preemptions == 1
    run_to_completion(sched)
    assert a.num_output_tokens == 8 and b.num_output_tokens == 8
    assert b.all_token_ids[11:] == [FILLER[i % 3] for i in range(8)]


def test_prefix_cache_counters_count_tokens_once_per_fresh_admission() -> None:
    sched = make_scheduler(block_size=4)
    tokens = list(range(100, 117))  # 17 tokens: 4 full blocks
    sched.add(make_request(tokens, output_len=1))
    run_to_completion(sched)
    sched.add(make_request(tokens, output_len=1))
    run_to_completion(sched)
    assert sched.stats.prefix_cache_queries == 34
    assert sched.stats.prefix_cache_hits == 16


def test_max_loras_defers_a_second_adapter_but_admits_later_base_requests() -> None:
    sched = make_scheduler(block_size=4, max_loras=1)
    la, lb = LoraKey("a", "/a", 1), LoraKey("b", "/b", 2)
    r1, r2, r3 = (
        make_request([1, 2, 3], lora=la),
        make_request([4, 5, 6], lora=lb),
        make_request([7, 8, 9]),
    )
    for r in (r1, r2, r3):
        sched.add(r)
    sched.schedule()
    assert sched.running == [r1, r3] and list(sched.waiting) == [r2]


def test_lora_and_salt_change_the_cache_key() -> None:
    sched = make_scheduler(block_size=4)
    tokens = list(range(100, 117))
    sched.add(make_request(tokens, output_len=1))
    run_to_completion(sched)
    salted, lora = make_request(tokens, salt="tenant-a"), make_request(tokens, lora=LoraKey("x", "/x", 1))
    for r in (salted, lora):
        sched.add(r)
    sched.schedule()
    assert salted.num_cached_tokens == 0 and lora.num_cached_tokens == 0


def test_caching_disabled_reports_no_hits_and_no_events() -> None:
    sched = make_scheduler(block_size=4, caching=False)
    tokens = list(range(100, 117))
    for _ in range(2):
        req = make_request(tokens, output_len=1)
        sched.add(req)
        run_to_completion(sched)
        assert req.num_cached_tokens == 0
    assert sched.kv.pool.take_events() == []


def test_fast_profile_step_time() -> None:
    assert FAST.step_time_s(StepCost()) == 0.0
    assert FAST.step_time_s(StepCost(prefill_tokens=2000)) == 1e-3 + 1e-3
