"""``cache_salt`` isolates tenants: different salts never share block keys, so never share index entries.

Shown at three levels: the hashing (every block key differs, the salt enters the first block and the chain
carries it), the index (memory and Redis: entries stored under one salt match nothing under another), and the
real router (a tenant's warm prompt is cold for another tenant, and for a request without a salt).
"""

from __future__ import annotations

import json
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.stack_config import MODEL
from extproc import wire
from extproc.app import App
from extproc.kvcache.hashing import BlockHasher
from extproc.kvcache.index import PrefixIndex
from extproc.kvcache.memory_index import MemoryPrefixIndex
from extproc.redis.prefix_index import RedisPrefixIndex
from extproc.types import EndpointId, HashScheme, HttpRequest, LoraAdapter, Route
from tests.fuzz.inproc import ready_app

SCHEMES = [HashScheme(block_size=16), HashScheme(block_size=16, algo="sha256_cbor")]
salts = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="@/\\\x00"), min_size=1, max_size=128)
# (Salts with lone surrogates have no sha256_cbor key at all, in vLLM or here: the router routes them by load,
# test_a_salt_no_hash_can_encode_is_routed_by_load below.)
E = EndpointId("127.0.0.1:18001")


@settings(max_examples=60, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 151_000), min_size=16, max_size=16 * 6),
    a=salts,
    b=salts,
    scheme=st.sampled_from(SCHEMES),
    lora=st.sampled_from([None, LoraAdapter("x", "/adapters/x")]),
)
def test_different_salts_share_no_block_key(
    tokens: list[int], a: str, b: str, scheme: HashScheme, lora: LoraAdapter | None
) -> None:
    hasher = BlockHasher(scheme)
    with_a = hasher.hash_blocks(tokens, lora=lora, cache_salt=a)
    with_b = hasher.hash_blocks(tokens, lora=lora, cache_salt=b)
    unsalted = hasher.hash_blocks(tokens, lora=lora)
    assert len(with_a) == len(tokens) // 16
    assert not set(with_a) & set(unsalted)
    if a != b:
        assert not set(with_a) & set(with_b)
    else:
        assert with_a == with_b


async def check_index(index: PrefixIndex) -> None:
    hasher = BlockHasher(SCHEMES[0])
    tokens = list(range(1000, 1000 + 16 * 8))
    keys = {salt: hasher.hash_blocks(tokens, cache_salt=salt) for salt in ("tenant-a", "tenant-b", None)}
    await index.store(E, keys["tenant-a"])
    assert (await index.match(keys["tenant-a"], [E])).get(E, 0) == 8
    assert (await index.match(keys["tenant-b"], [E])).get(E, 0) == 0
    assert (await index.match(keys[None], [E])).get(E, 0) == 0


async def test_memory_index_isolates_salts() -> None:
    index = MemoryPrefixIndex()
    await check_index(index)
    await index.close()


@pytest.mark.redis
async def test_redis_index_isolates_salts(valkey_url: str) -> None:
    index = await RedisPrefixIndex.connect(valkey_url, namespace=f"salt-{uuid.uuid4().hex[:8]}")
    try:
        await check_index(index)
    finally:
        await index.close()


def chat(salt: str | None) -> HttpRequest:
    document = "The tenant's private contract. " * 60
    body: dict[str, object] = {"model": MODEL, "messages": [{"role": "user", "content": document}]}
    if salt is not None:
        body["cache_salt"] = salt
    headers = {":method": "POST", ":path": "/v1/chat/completions", "content-type": "application/json"}
    return HttpRequest("POST", "/v1/chat/completions", headers, json.dumps(body).encode(), "r")


async def test_router_never_credits_one_tenants_cache_to_another() -> None:
    app: App = await ready_app()
    try:
        first = await app.router.route(chat("tenant-a"))
        again = await app.router.route(chat("tenant-a"))
        other = await app.router.route(chat("tenant-b"))
        bare = await app.router.route(chat(None))
    finally:
        await app.stop()
    assert isinstance(first, Route) and isinstance(again, Route)
    assert isinstance(other, Route) and isinstance(bare, Route)
    assert int(first.headers[wire.CACHED_TOKENS_HEADER]) == 0
    assert int(again.headers[wire.CACHED_TOKENS_HEADER]) > 0, "the same tenant's repeat is warm"
    assert int(other.headers[wire.CACHED_TOKENS_HEADER]) == 0, "another tenant's identical prompt is cold"
    assert int(bare.headers[wire.CACHED_TOKENS_HEADER]) == 0, "an unsalted identical prompt is cold"


async def test_a_salt_no_hash_can_encode_is_routed_by_load() -> None:
    """A JSON ``"\\ud800"`` salt is a lone surrogate: sha256_cbor cannot encode it (nor can vLLM's). The request
    is routed by load, with no error (it used to escape as UnicodeEncodeError and fail open with a traceback)."""
    app: App = await ready_app(models=[{"name": MODEL, "hash_algo": "sha256_cbor"}])
    try:
        body = json.dumps({"model": MODEL, "cache_salt": "\ud800", "messages": [
            {"role": "user", "content": "The tenant's private contract. " * 20}]}).encode()  # fmt: skip
        headers = {":method": "POST", ":path": "/v1/chat/completions", "content-type": "application/json"}
        route = await app.router.route(HttpRequest("POST", "/v1/chat/completions", headers, body, "r"))
    finally:
        await app.stop()
    assert isinstance(route, Route) and int(route.headers[wire.CACHED_TOKENS_HEADER]) == 0
