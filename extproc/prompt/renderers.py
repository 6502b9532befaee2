"""A model's chat-template renderer: ``FastTemplate`` while it holds up, ``apply_chat_template`` otherwise.

``TemplateChoice`` is what ``render.render_chat_text`` calls (the same ``apply_chat_template`` slice as the HF
tokenizer). It is chosen once per model by ``TemplateChoice.of`` after ``self_check`` rendered
``check_conversations`` both ways; live, it offers a sampled share of its renders to the same ``ShadowCheck``
the fast encoder uses (``router_tokenizer_checks{check="template"}``).
"""

from __future__ import annotations

import copy
import functools
import inspect
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from extproc.prompt.shadow import ShadowCheck
from extproc.prompt.templates import RENDERER_FAST, RENDERER_HF, REPRODUCED_PARAMS, FastTemplate, HfRenderer, NotPlain

__all__ = ["CheckCase", "TemplateChoice", "check_conversations", "self_check"]

log = logging.getLogger(__name__)

CheckCase = tuple[list[dict[str, Any]], dict[str, Any]]  # (conversation, apply_chat_template kwargs)


@dataclass
class TemplateChoice:
    """Renders like ``reference.apply_chat_template``; through ``fast`` when it is set and has not fallen back.

    Thread-safe like ``EncoderChoice``: ``fall_back`` sets the reason once; readers see either path.
    """

    model: str
    reference: HfRenderer
    fast: FastTemplate | None = None
    fallback_reason: str | None = None  # why the reference renders although a fast template was considered
    shadow: ShadowCheck | None = None
    hf_params: frozenset[str] = field(default_factory=frozenset)  # apply_chat_template's named parameters
    check: ClassVar[str] = "template"  # the shadow check's label

    @classmethod
    def of(
        cls, model: str, reference: HfRenderer, *, fast: bool = True, shadow: ShadowCheck | None = None
    ) -> TemplateChoice:
        """The choice for ``reference``'s template: fast once it renders ``check_conversations`` identically."""
        choice = cls(model, reference, shadow=shadow, hf_params=_named_params(reference))
        template = FastTemplate.of(reference) if fast else None
        if template is None:
            return choice
        choice.fast = template
        difference = self_check(template, reference, check_conversations())
        if difference is not None:
            choice.fall_back(f"start-up self-check: {difference}")
        else:
            log.info("model %s: rendering its chat template with %s (equal to apply_chat_template on the "
                     "self-check conversations)", model, RENDERER_FAST)  # fmt: skip
        return choice

    @property
    def name(self) -> str:
        return RENDERER_FAST if self._fast() is not None else RENDERER_HF

    def _fast(self) -> FastTemplate | None:
        return self.fast if self.fallback_reason is None else None

    def apply_chat_template(self, conversation: list[dict[str, Any]], **kwargs: Any) -> Any:
        """``reference.apply_chat_template(conversation, **kwargs)``'s result; the fast path serves only
        ``tokenize=False`` with the parameters it reproduces (anything else goes to the reference)."""
        fast = self._fast()
        extra = (self.hf_params & kwargs.keys()) - REPRODUCED_PARAMS - {"tokenize"}
        if fast is None or kwargs.get("tokenize", True) is not False or extra:
            return self.reference.apply_chat_template(conversation, **kwargs)
        try:
            text = fast.render(conversation, **{k: v for k, v in kwargs.items() if k != "tokenize"})
        except NotPlain:
            return self.reference.apply_chat_template(conversation, **kwargs)
        except Exception as exc:  # the reference decides; rendering where we raised is a difference
            text = self.reference.apply_chat_template(conversation, **kwargs)
            self.fall_back(f"live request ({len(conversation)} messages): the fast template raised "
                           f"{type(exc).__name__} where apply_chat_template rendered")  # fmt: skip
            return text
        if self.shadow is not None:
            self.shadow.offer(
                self, f"{len(conversation)} messages", text,
                lambda: self.reference.apply_chat_template(conversation, **kwargs), _text_difference,
            )  # fmt: skip
        return text

    def fall_back(self, reason: str) -> None:
        if self.fallback_reason is None:
            self.fallback_reason = reason
            log.warning("model %s: the fast chat-template renderer disagreed with apply_chat_template (%s); "
                        "rendering with apply_chat_template from now on", self.model, reason)  # fmt: skip


def _named_params(reference: HfRenderer) -> frozenset[str]:
    try:
        params = inspect.signature(reference.apply_chat_template).parameters.values()
    except (TypeError, ValueError):
        return frozenset()
    return frozenset(p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL))


def _text_difference(ours: Any, ref: Any) -> str | None:
    if ours == ref:
        return None
    if not isinstance(ours, str) or not isinstance(ref, str):
        return f"rendered {type(ours).__name__} vs {type(ref).__name__}"
    at = next((i for i, (a, b) in enumerate(zip(ours, ref, strict=False)) if a != b), min(len(ours), len(ref)))
    return f"{len(ours)} vs {len(ref)} chars, first difference at char {at}"


def self_check(fast: FastTemplate, reference: HfRenderer, cases: Iterable[CheckCase]) -> str | None:
    """None when ``fast`` renders every case as ``reference`` does (or both raise); else the first difference,
    described without the text (the message format is shared with the live check)."""
    for i, (conversation, kwargs) in enumerate(cases):
        ours = _outcome(fast.render, conversation, kwargs)
        ref = _outcome(reference.apply_chat_template, conversation, {"tokenize": False, **kwargs})
        if isinstance(ours, Exception) and isinstance(ref, Exception):
            continue
        if isinstance(ours, Exception):
            return f"case {i}: only the fast template raised ({type(ours).__name__})"
        if isinstance(ref, Exception):
            return f"case {i}: only apply_chat_template raised ({type(ref).__name__})"
        if (found := _text_difference(ours, ref)) is not None:
            return f"case {i}: {found}"
    return None


def _outcome(render: Callable[..., Any], conversation: list[dict[str, Any]], kwargs: dict[str, Any]) -> Any:
    """What ``render`` returns, or the exception it raised (each side gets its own copy of the case)."""
    try:
        return render(copy.deepcopy(conversation), **copy.deepcopy(kwargs))
    except Exception as exc:
        return exc


def _as_content(content: str, *, parts: bool) -> Any:
    return [{"type": "text", "text": content}] if parts else content


def check_conversations() -> list[CheckCase]:
    """Conversations (as ``render.to_conversation`` builds them) and kwargs on which a fast template must equal
    the reference: system prompts, multi-turn, reasoning (every alias), tools and tool calls, tool results,
    multi-part content, a developer message, documents, names, empty content, template-looking and special-token
    text, the generation prompt on and off, thinking on and off, and continuing the final message."""
    tools = [{"type": "function", "function": {"name": "lookup", "description": "Find a row.", "parameters": {
        "type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}}}]  # fmt: skip
    call = {"id": "call00001", "type": "function", "function": {"name": "lookup", "arguments": {"id": "7"}}}
    tricky = "{{ 7*7 }} {% if x %}<|im_start|>[INST]</s><|eot_id|>\n\n  café 😀 \t"
    cases: list[CheckCase] = []
    for parts in (False, True):
        t = functools.partial(_as_content, parts=parts)
        chats: list[list[dict[str, Any]]] = [
            [{"role": "user", "content": t("Hello")}],
            [{"role": "system", "content": t("Be brief.")}, {"role": "user", "content": t("Hi")}],
            [{"role": "system", "content": t("S")}, {"role": "user", "content": t("Q1")},
             {"role": "assistant", "content": t("A1"), "reasoning": "think", "reasoning_content": "think"},
             {"role": "user", "content": t("Q2")}],
            [{"role": "user", "content": t("Weather?")},
             {"role": "assistant", "content": t(""), "tool_calls": [call]},
             {"role": "tool", "content": t('{"t": 21}'), "tool_call_id": "call00001"},
             {"role": "assistant", "content": t("It is 21.")}, {"role": "user", "content": t("Thanks")}],
            [{"role": "developer", "content": t("Dev rules"), "tools": None},
             {"role": "user", "content": t(tricky), "name": "bob"}],
            [{"role": "user", "content": t("")}, {"role": "assistant", "content": None, "thinking": "t"},
             {"role": "user", "content": t(tricky)}],
            [{"role": "user", "content": t("a")}, {"role": "user", "content": t("b")}],
            [{"role": "assistant", "content": t("first")}, {"role": "user", "content": t("c")}],
        ]  # fmt: skip
        for chat in chats:
            for gen in (True, False):
                cases.append((chat, {"add_generation_prompt": gen}))
            cases.append((chat, {"add_generation_prompt": True, "tools": tools}))
            cases.append((chat, {"add_generation_prompt": True, "enable_thinking": False}))
            cases.append((chat, {"add_generation_prompt": True, "documents": [{"title": "d", "text": "x"}]}))
        done = [{"role": "user", "content": t("Write")}, {"role": "assistant", "content": t("Once upon ")}]
        cases.append((done, {"continue_final_message": True}))
        cases.append(([*done[:1], {"role": "assistant", "content": t("x"), "reasoning_content": "r "}],
                      {"continue_final_message": "reasoning_content"}))  # fmt: skip
    return cases
