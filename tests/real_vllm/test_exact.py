"""The picker's predictions against real vLLM: every request's predicted cached tokens == the engine's own
``usage.prompt_tokens_details.cached_tokens``, and the engine that served it is the one the picker named.

Two engines (vLLM CPU, block size 128, ``sha256_cbor``, PYTHONHASHSEED unset), the picker following their KV
events, real Envoy in front. Each case starts from empty caches (``/reset_prefix_cache`` on both, so the picker
also sees ``AllBlocksCleared``), warms one engine, then sends the probe that should (or should not) hit.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.real_vllm.checks import Tally, checked, post_json
from tests.real_vllm.fleet import BLOCK_SIZE, LORA_NAME, Fleet
from tests.real_vllm.prompts import WEATHER_TOOL, ask, chat, completion, document

pytestmark = [pytest.mark.real_vllm, pytest.mark.envoy, pytest.mark.slow]

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
DOC = document(1)

# (id, path, warm body, probe body, the probe must hit)
CASES: list[tuple[str, str, dict[str, Any], dict[str, Any], bool]] = [
    ("system_prompt", CHAT, chat(ask(DOC, "Summarise it.")), chat(ask(DOC, "What is the conclusion?")), True),
    (
        "multi_turn",
        CHAT,
        chat(ask(DOC, "Summarise it.")),
        chat(
            [
                *ask(DOC, "Summarise it."),
                {"role": "assistant", "content": "It is about rivers."},
                {"role": "user", "content": "And section 3?"},
            ]
        ),
        True,
    ),
    (
        "tools",
        CHAT,
        chat(ask(DOC, "Weather in Oslo?"), tools=[WEATHER_TOOL]),
        chat(ask(DOC, "Weather in Rome?"), tools=[WEATHER_TOOL]),
        True,
    ),
    (
        "chat_template_kwargs",
        CHAT,
        chat(ask(DOC, "Summarise it."), chat_template_kwargs={"enable_thinking": False}),
        chat(ask(DOC, "List the sections."), chat_template_kwargs={"enable_thinking": False}),
        True,
    ),
    (
        "continue_final_message",
        CHAT,
        chat(
            [*ask(DOC, "Summarise it."), {"role": "assistant", "content": "The report"}],
            add_generation_prompt=False,
            continue_final_message=True,
        ),
        chat(
            [*ask(DOC, "Summarise it."), {"role": "assistant", "content": "The report says that"}],
            add_generation_prompt=False,
            continue_final_message=True,
        ),
        True,
    ),
    ("completion_text", COMPLETIONS, completion(f"{DOC}\nSummary:"), completion(f"{DOC}\nConclusion:"), True),
    (
        "cache_salt_same",
        CHAT,
        chat(ask(DOC, "Summarise it."), cache_salt="tenant-a"),
        chat(ask(DOC, "Conclusion?"), cache_salt="tenant-a"),
        True,
    ),
    (
        "cache_salt_other",
        CHAT,
        chat(ask(DOC, "Summarise it."), cache_salt="tenant-a"),
        chat(ask(DOC, "Summarise it."), cache_salt="tenant-b"),
        False,
    ),
    (
        "leading_space",
        CHAT,
        chat(ask(DOC, "Summarise it.", system=False)),
        chat(ask(" " + DOC, "Summarise it.", system=False)),
        False,
    ),
    (
        "lora",
        CHAT,
        chat(ask(DOC, "Summarise it."), model=LORA_NAME),
        chat(ask(DOC, "Conclusion?"), model=LORA_NAME),
        True,
    ),
    ("lora_vs_base", CHAT, chat(ask(DOC, "Summarise it.")), chat(ask(DOC, "Summarise it."), model=LORA_NAME), False),
    (
        "stream_include_usage",
        CHAT,
        chat(ask(DOC, "Summarise it.")),
        chat(ask(DOC, "Conclusion?"), stream=True, stream_options={"include_usage": True}),
        True,
    ),
]


@pytest.mark.parametrize(("path", "warm", "probe", "hit"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_prediction_equals_the_engines_cached_tokens(
    fleet: Fleet, tally: Tally, request: pytest.FixtureRequest, path: str, warm: dict[str, Any],
    probe: dict[str, Any], hit: bool,
) -> None:  # fmt: skip
    name = request.node.callspec.id
    fleet.reset_prefix_caches()
    first = checked(fleet, tally, f"{name}/warm", path, warm)
    assert first.reported == 0
    second = checked(fleet, tally, f"{name}/probe", path, probe)
    if hit:
        assert second.reported >= 2 * BLOCK_SIZE and second.reason == "cache"
        assert second.served == first.served
    else:
        assert second.reported == 0


def test_completion_token_ids(fleet: Fleet, tally: Tally) -> None:
    """A prompt given as token ids (from the engine's own /tokenize) hashes the same as the engine's."""
    fleet.reset_prefix_caches()
    status, tokenized = post_json(fleet.engine_url(0, "/tokenize"), {"model": "Qwen/Qwen3-0.6B", "prompt": DOC})
    assert status == 200
    ids = list(tokenized["tokens"])
    checked(fleet, tally, "token_ids/warm", COMPLETIONS, completion([*ids, 11, 12]))
    second = checked(fleet, tally, "token_ids/probe", COMPLETIONS, completion([*ids, 13]))
    assert second.reported == (len(ids) // BLOCK_SIZE) * BLOCK_SIZE


def test_many_documents_stay_exact(fleet: Fleet, tally: Tally) -> None:
    """Several users' documents interleaved: each follow-up goes to the engine holding its document."""
    fleet.reset_prefix_caches()
    docs = [document(seed) for seed in (11, 12, 13)]
    for i, doc in enumerate(docs):
        checked(fleet, tally, f"interleaved/warm{i}", CHAT, chat(ask(doc, "Summarise it.")))
    for i, doc in enumerate(docs):
        result = checked(fleet, tally, f"interleaved/probe{i}", CHAT, chat(ask(doc, "Conclusion?")))
        assert result.reported > 0
