"""The proof behind the fast chat-template renderer: ``FastTemplate`` renders what ``apply_chat_template`` renders.

Templates: Qwen3's and Mistral-7B-Instruct-v0.3's (``tokenizer_cache/``) and the Llama-3 stand-in the encoder
tests use (the packaged Llama 3.2 tokenizer has none). Per template: the start-up self-check passes, and a
property test (hypothesis, derandomized) compares both paths on adversarial conversations: both raise, or both
give the same text. Then the seam with fakes: a template that differs at start-up or live falls back to the
reference (logged, counted), a fast render that raises is redone by the reference, and the sandbox's refusals
hold for names and format strings that come from user content.
"""

from __future__ import annotations

import copy
import logging
from concurrent.futures import Executor, Future
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.stack_config import MODEL, REPO
from extproc.observability import TokenizerCollector
from extproc.prompt.models import BaseModel
from extproc.prompt.renderers import TemplateChoice, check_conversations, self_check
from extproc.prompt.shadow import ShadowCheck
from extproc.prompt.templates import RENDERER_FAST, RENDERER_HF, FastTemplate, NotPlain
from extproc.prompt.tokenizers import EncoderSettings, TokenizerRegistry, load_hf_tokenizer
from tests.prompt.test_encoder_equality import LLAMA3_TEMPLATE

PROPERTY = settings(
    max_examples=200, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow]
)
TEMPLATES = {
    "qwen3": "Qwen/Qwen3-0.6B",
    "mistral": "mistralai/Mistral-7B-Instruct-v0.3",
    "llama3": "meta-llama/Llama-3.2-11B-Vision",  # with LLAMA3_TEMPLATE
}


@pytest.fixture(scope="module", params=sorted(TEMPLATES))
def hf(request: pytest.FixtureRequest) -> Any:
    folder = REPO / "tokenizer_cache" / TEMPLATES[request.param]
    if not (folder / "tokenizer_config.json").exists():
        pytest.fail(f"{folder} is missing: run scripts/setup.sh")
    tokenizer = load_hf_tokenizer(Path(folder))
    if tokenizer.chat_template is None:
        tokenizer.chat_template = LLAMA3_TEMPLATE
    return tokenizer


def outcome(render: Any, conversation: list[dict[str, Any]], **kwargs: Any) -> str:
    try:
        return str(render(copy.deepcopy(conversation), **copy.deepcopy(kwargs)))
    except Exception as exc:
        return f"raised {type(exc).__name__}"


def test_every_loaded_template_passes_its_self_check_and_renders_fast(hf: Any) -> None:
    choice = TemplateChoice.of("m", hf)
    assert (choice.name, choice.fallback_reason) == (RENDERER_FAST, None)
    rendered = sum(not outcome(hf.apply_chat_template, c, tokenize=False, **k).startswith("raised") for c, k in
                   check_conversations())  # fmt: skip
    assert rendered >= len(check_conversations()) // 3  # the check renders, it does not only agree on errors


# Adversarial text: template syntax, every family's control tokens, whitespace runs, unicode, JSON-ish.
PIECES = ["{{ 7*7 }}", "{% if x %}", "{#", "<|im_start|>", "<|im_end|>", "[INST]", "[/INST]", "</s>", "<s>",
          "<|eot_id|>", "<|start_header_id|>", "<think>", "</think>", "<tool_call>", "\n", "\n\n", "  ", "\t", " ",
          "word", "é", "中文", "😀", '{"a": 1}', "\\", "'", '"', "__class__", "{0.__class__}", "null"]  # fmt: skip
texts = st.lists(st.sampled_from(PIECES), max_size=8).map("".join)


@st.composite
def messages(draw: st.DrawFn, role: str | None = None, parts: bool = False) -> dict[str, Any]:
    """One message; ``parts``: content as a list of text parts ("openai" content format) where vLLM sends one."""
    role = role or draw(st.sampled_from(["system", "user", "assistant", "tool", "developer"]))
    content: Any = draw(texts)
    if parts and role != "tool":
        content = [{"type": "text", "text": t} for t in draw(st.lists(texts, min_size=1, max_size=3))]
    elif draw(st.integers(0, 29)) == 0:
        content = None
    message: dict[str, Any] = {"role": role, "content": content}
    if role == "assistant" and draw(st.booleans()):
        message["reasoning"] = message["reasoning_content"] = draw(texts)
    if role == "assistant" and draw(st.integers(0, 3)) == 0:
        arguments = draw(st.dictionaries(st.sampled_from(["q", "n", "__x"]), texts | st.integers(), max_size=2))
        message["content"] = draw(st.sampled_from([None, "", content]))  # templates differ on what they accept
        message["tool_calls"] = [{"id": draw(st.sampled_from(["call00001", "c1"])), "type": "function",
                                  "function": {"name": draw(st.sampled_from(["lookup", "x"])), "arguments": arguments}}]  # fmt: skip
    if role == "tool":
        message["tool_call_id"] = "call00001"
    if draw(st.integers(0, 5)) == 0:
        message["name"] = draw(texts)
    return message


@st.composite
def conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Mostly well-formed chats (system?, then user/assistant turns, tool calls answered), a quarter in any order."""
    parts = draw(st.integers(0, 3)) == 0
    if draw(st.integers(0, 3)) == 0:
        return draw(st.lists(messages(parts=parts), min_size=1, max_size=6))
    chat = [draw(messages("system", parts))] if draw(st.booleans()) else []
    for _ in range(draw(st.integers(1, 3))):
        chat.append(draw(messages("user", parts)))
        reply = draw(messages("assistant", parts))
        chat.append(reply)
        if "tool_calls" in reply:
            chat += [draw(messages("tool", parts)), draw(messages("assistant", parts))]
    return chat if draw(st.booleans()) else chat[:-1]  # ending on the user's turn, or continuing the assistant's


@st.composite
def requests(draw: st.DrawFn) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    conversation = draw(conversations())
    kwargs: dict[str, Any] = {}
    if conversation[-1]["role"] == "assistant" and draw(st.booleans()):
        kwargs["continue_final_message"] = draw(st.sampled_from([True, "reasoning_content"]))
    else:
        kwargs["add_generation_prompt"] = draw(st.booleans())
    if draw(st.booleans()):
        kwargs["enable_thinking"] = draw(st.booleans())
    if draw(st.integers(0, 2)) == 0:
        kwargs["tools"] = [{"type": "function", "function": {"name": draw(texts), "description": draw(texts),
                                                             "parameters": {"type": "object"}}}]  # fmt: skip
    if draw(st.integers(0, 4)) == 0:
        kwargs["documents"] = [{"title": draw(texts), "text": draw(texts)}]
    return conversation, kwargs


@PROPERTY
@given(request=requests())
def test_fast_renders_what_apply_chat_template_renders(
    hf: Any, request: tuple[list[dict[str, Any]], dict[str, Any]]
) -> None:
    conversation, kwargs = request
    fast = FastTemplate.of(hf)
    assert fast is not None
    ours = outcome(fast.render, conversation, **kwargs)
    ref = outcome(hf.apply_chat_template, conversation, tokenize=False, **kwargs)
    if ours.startswith("raised") and ref.startswith("raised"):
        return
    assert ours == ref


class Inline(Executor):
    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_result(fn(*args, **kwargs))
        return future


class Echo:
    """A reference renderer: the template through ``FastTemplate`` (so the self-check passes), except that a
    message whose content is ``drift`` comes out different (the fast path's bug, seen from the other side)."""

    chat_template = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"

    def __init__(self, drift: str | None = None) -> None:
        self.drift, self.calls = drift, 0

    def apply_chat_template(self, conversation: list[dict[str, Any]], **kwargs: Any) -> str:
        self.calls += 1
        fast = FastTemplate(self.chat_template, {})
        text = fast.render(conversation, **{k: v for k, v in kwargs.items() if k != "tokenize"})
        drifted = self.drift is not None and any(m.get("content") == self.drift for m in conversation)
        return text + "!" if drifted else text


def test_a_template_that_differs_at_start_up_runs_on_the_reference(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    choice = TemplateChoice.of("m", Echo(drift="Hello"))
    assert choice.name == RENDERER_HF and "start-up self-check: case 0" in (choice.fallback_reason or "")
    assert "disagreed with apply_chat_template" in caplog.text and "Hello" not in caplog.text


def test_a_live_mismatch_is_counted_and_switches_the_model_to_the_reference() -> None:
    results: list[tuple[str, str, bool]] = []
    shadow = ShadowCheck(1.0, Inline(), on_result=lambda m, check, ok: results.append((m, check, ok)))
    reference = Echo(drift="odd")
    choice = TemplateChoice.of("m", reference, shadow=shadow)
    assert choice.name == RENDERER_FAST
    assert choice.apply_chat_template([{"role": "user", "content": "fine"}], tokenize=False) == "[user]fine"
    assert results == [("m", "template", True)]
    assert choice.apply_chat_template([{"role": "user", "content": "odd"}], tokenize=False) == "[user]odd"
    assert results[-1] == ("m", "template", False) and choice.name == RENDERER_HF
    assert "live request (1 messages)" in (choice.fallback_reason or "")
    assert choice.apply_chat_template([{"role": "user", "content": "odd"}], tokenize=False) == "[user]odd!"
    assert len(results) == 2  # nothing is re-checked once on the reference


def test_what_the_fast_path_does_not_reproduce_goes_to_the_reference() -> None:
    reference = Echo()
    choice = TemplateChoice.of("m", reference)
    before = reference.calls
    choice.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False)
    assert reference.calls == before  # the fast path
    choice.apply_chat_template([{"role": "user", "content": "x"}])  # tokenize defaults to True
    with pytest.raises(NotPlain):  # not JSON data: the reference gets it (this fake reference cannot render it)
        choice.apply_chat_template([{"role": "user", "content": object()}], tokenize=False)
    assert reference.calls == before + 2 and choice.name == RENDERER_FAST


def test_a_fast_render_that_raises_where_the_reference_renders_falls_back() -> None:
    class Lenient(Echo):
        chat_template = "{{ raise_exception('strict') if messages[0].content == 'x' }}{{ messages[0].content }}"

        def apply_chat_template(self, conversation: list[dict[str, Any]], **kwargs: Any) -> str:
            return str(conversation[0]["content"])

    choice = TemplateChoice("m", Lenient(), FastTemplate(Lenient.chat_template, {}))
    assert choice.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False) == "x"
    assert choice.name == RENDERER_HF and "raised TemplateError" in (choice.fallback_reason or "")


@pytest.mark.parametrize(
    ("template", "content", "expected"),
    [
        ("{{ messages[0][messages[0].content] }}", "__class__", ""),  # a user-chosen name: still refused
        ("{{ messages[0].content.format(messages[0]) }}", "{0.__class__}", ""),  # the sandbox's formatter
        ("{{ messages[0].content.format_map({'a': messages[0]}) }}", "{a.__class__}", ""),
        ("{{ (messages[0].content | attr('format'))(messages[0]) }}", "{0.__class__}", ""),
        ("{{ messages[0].content['format'](messages[0]) }}", "{0.__class__}", ""),
        ("{% set ns = namespace(f=messages[0].content.format) %}{{ ns.f(messages[0]) }}", "{0.__class__}", ""),
        ("{{ messages[0].content | attr('__class__') }}", "x", ""),
        ("{% set _ = messages.append(1) %}{{ messages | length }}", "x", "raised SecurityError"),
        ("{{ messages[0].items() | list | length }}", "x", "2"),  # a dict's own methods still work
        ("{% set ns = namespace(a=1) %}{% set ns.b = 2 %}{{ ns.a + ns.b }}", "x", "3"),
        ("{{ range(200000) | length }}", "x", "raised OverflowError"),
    ],
    ids=[
        "user-key",
        "user-format",
        "user-format-map",
        "format-by-attr-filter",
        "format-by-subscript",
        "format-kept-in-a-namespace",
        "attr-filter",
        "mutation",
        "dict-method",
        "namespace",
        "range",
    ],
)
def test_the_sandbox_refuses_what_it_refused(template: str, content: str, expected: str) -> None:
    hf_like = FastTemplate(template, {})
    assert outcome(hf_like.render, [{"role": "user", "content": content}]) == expected


def test_special_tokens_are_template_variables_and_kwargs_win() -> None:
    fast = FastTemplate("{{ eos_token }}|{{ bos_token }}", {"eos_token": "</s>", "bos_token": "<s>"})
    assert fast.render([{"role": "user", "content": "x"}]) == "</s>|<s>"
    assert fast.render([{"role": "user", "content": "x"}], eos_token="E") == "E|<s>"


def test_self_check_names_the_case_without_quoting_it() -> None:
    found = self_check(FastTemplate(Echo.chat_template, {}), Echo(drift="Hi"), check_conversations())
    assert found is not None and found.startswith("case ") and "Hi" not in found


@pytest.mark.parametrize("fast", [True, False], ids=["auto", "hf"])
def test_the_registry_gives_each_model_its_renderer_and_the_metrics_say_which(fast: bool) -> None:
    registry = TokenizerRegistry(REPO / "tokenizer_cache", encoders=EncoderSettings(fast_templates=fast))
    loaded = registry.get(BaseModel(MODEL))
    assert loaded.renderer.name == (RENDERER_FAST if fast else RENDERER_HF)
    collector = TokenizerCollector(registry.encoders, registry.segment_stats, list, registry.renderers)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in collector.collect() for s in f.samples}
    assert samples[("router_template_renderer", (("model", MODEL), ("renderer", loaded.renderer.name)))] == 1
    assert samples[("router_template_fallback", (("model", MODEL),))] == 0
