"""``--sim-token-cache-tokens``: the bound of the tokenizer's result cache reaches the cache the cluster builds."""

from __future__ import annotations

from tests.sim.helpers import sim_config
from vllm_sim.cluster import SimCluster
from vllm_sim.tokenize import TokenCache


def test_the_flag_sets_the_bound_and_the_default_stays() -> None:
    assert sim_config().sim.token_cache_tokens == 1_000_000
    assert sim_config("--sim-token-cache-tokens", "4000000").sim.token_cache_tokens == 4_000_000


async def test_the_cluster_builds_its_tokenizer_cache_with_that_bound() -> None:
    async with SimCluster(sim_config("--sim-token-cache-tokens", "7")) as cluster:
        cache = cluster.servers[0].frontend.tokenizer._cache
        assert isinstance(cache, TokenCache)
        assert cache._max_tokens == 7
        await cluster.servers[0].frontend.tokenizer.completion("one two three four five six seven eight nine")
        assert cache.get(b"p1one two three four five six seven eight nine") is None  # longer than the bound
