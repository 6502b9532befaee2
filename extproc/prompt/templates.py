"""Chat-template rendering behind one seam: HF's ``apply_chat_template`` (the reference) or a faster exact one.

vLLM renders with ``tokenizer.apply_chat_template(..., tokenize=False)``; that stays our reference and our
fallback. ``FastTemplate`` renders the same template source to the same text, ~3-4x cheaper on long chats:

- the same preprocessing as transformers (5.x ``apply_chat_template`` -> ``render_jinja_template``): keys whose
  value is None dropped from each message, everything the template sees rebuilt from plain JSON types
  (``_plain_template_data``), reasoning aliased (``reasoning_content``/``thinking``/``reasoning``), the tokenizer's
  ``special_tokens_map`` under the kwargs, ``continue_final_message``'s tag-and-cut;
- the same environment: trim/lstrip blocks, ``loopcontrols``, the ``{% generation %}`` block, the ``tojson``
  filter and the ``raise_exception``, ``strftime_now``, ``dict`` and ``namespace`` globals;
- still jinja2's *immutable sandbox*: ``_MemoSandbox`` makes every check the sandbox makes, it only remembers
  the answer of ``is_safe_attribute`` per (type, attribute) and skips the Python ``getattr`` that must fail for
  a key of a plain ``dict`` (what made the sandbox 3x slower than a plain ``Environment``, measured on a
  400-message chat).

Proof, as for the fast encoder (``renderers.py``): ``TemplateChoice.of`` renders ``check_conversations``
both ways at load (a template that differs once runs on the reference, and the log says so); ``ShadowCheck``
re-renders a sampled fraction of live requests with the reference off the hot path (a mismatch is counted,
logged, and switches that model to the reference for good); and a fast render that raises is redone by the
reference, so the fast path can never fail a request the reference would render. Templates with
``strftime_now`` read the clock: a shadow re-render across midnight may differ once (and falls back; the log
says so).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Protocol

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.sandbox
import jinja2.utils

__all__ = ["RENDERER_FAST", "RENDERER_HF", "REPRODUCED_PARAMS", "FastTemplate", "GenerationTag", "NotPlain"]

log = logging.getLogger(__name__)

RENDERER_HF = "hf"
RENDERER_FAST = "sandbox-memo"
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")  # transformers' order: the first is standard
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
# apply_chat_template parameters FastTemplate reproduces; a call with any other of its named parameters
# (sanitize_control_tokens, return_assistant_tokens_mask, ...) goes to the reference.
REPRODUCED_PARAMS = frozenset({"conversation", "tools", "documents", "add_generation_prompt", "continue_final_message"})
_DICT_ATTRIBUTES = frozenset(dir(dict))  # what getattr(d, name) finds on a plain dict: nothing else can exist
_SAFE_MEMO_MAX = 4096  # (type, attribute) answers remembered; attribute names come from the template source
_MISSING = object()
_FORMAT_METHODS = frozenset({"format", "format_map"})  # what ``wrap_str_format`` wraps (of a str or Markup)


class HfRenderer(Protocol):
    """The slice of a ``transformers`` tokenizer the reference path uses."""

    chat_template: Any

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...


class NotPlain(Exception):
    """Template data that is not plain JSON: transformers would rewrite it; the reference renders it."""


class GenerationTag(jinja2.ext.Extension):
    """HF's ``{% generation %}...{% endgeneration %}``: a call block whose output is its body's (the assistant
    mask tracker is never active here), so ``set`` inside it stays local exactly as in transformers."""

    tags = {"generation"}  # noqa: RUF012 (jinja2's class attribute)

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node | list[jinja2.nodes.Node]:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_generation"), [], [], body).set_lineno(lineno)

    def _generation(self, caller: Callable[[], str]) -> str:
        return caller()


class _MemoSandbox(jinja2.sandbox.ImmutableSandboxedEnvironment):
    """jinja2's immutable sandbox with the same answers, remembered.

    Why this is as safe as the sandbox: every attribute a template reaches still passes
    ``is_safe_attribute`` (no ``_`` names, no function/frame/generator internals, no list/dict/set mutators) and
    ``str.format`` still goes through the sandboxed formatter; calls still pass ``is_safe_callable``. Only three
    things are cut: (1) for an exact ``dict`` and a name that is not one of dict's attributes, Python's getattr
    cannot succeed (a dict has no instance attributes), so we go straight to the key lookup the sandbox would
    fall back to (``dict.get``: a missing key raises nothing); (2) ``is_safe_attribute`` depends on the object's
    type and the name only, so its answer is kept per (type, name); (3) ``wrap_str_format`` wraps only a method
    named ``format`` or ``format_map`` of a str, which getattr returns only for those two names (str has no
    aliases of them, and every way a template can obtain one, attribute, ``attr`` filter or subscript, goes
    through this method or the sandbox's own ``getitem``, which wrap it), so it is asked for those names only.
    Message content is template *data*: it is never compiled, and a name a user controls (``x[user_key]``)
    reaches ``getitem``, which is the sandbox's own, unchanged.
    """

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._safe: dict[tuple[type, str], bool] = {}  # {(type of obj, attribute): is_safe_attribute}

    def getattr(self, obj: Any, attribute: str) -> Any:
        if type(obj) is dict and attribute not in _DICT_ATTRIBUTES:
            value = obj.get(attribute, _MISSING)  # no KeyError raised and caught for a missing key
            return self.undefined(obj=obj, name=attribute) if value is _MISSING else value
        try:
            value = getattr(obj, attribute)
        except AttributeError:
            try:
                return obj[attribute]
            except (TypeError, LookupError):
                return self.undefined(obj=obj, name=attribute)
        if attribute in _FORMAT_METHODS:  # only str.format and format_map are wrapped (the sandbox's own test)
            fmt = self.wrap_str_format(value)
            if fmt is not None:
                return fmt
        key = (type(obj), attribute)
        safe = self._safe.get(key)
        if safe is None:
            safe = self.is_safe_attribute(obj, attribute, value)
            if len(self._safe) < _SAFE_MEMO_MAX:
                self._safe[key] = safe
        return value if safe else self.unsafe_undefined(obj, attribute)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
) -> str:
    # transformers' filter: no HTML escaping, and its options
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:  # the name templates pass it by
    return datetime.now().strftime(format)


class _TemplateDict:
    """transformers' ``dict`` global: a constructor and ``fromkeys``, nothing to reach the type through."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """transformers' ``namespace``: refuses underscore names, as a stored attribute and as a set one."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # jinja's trick: ``self`` may be a key
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)


def _check_name(name: object) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(f"chat templates cannot store underscore-prefixed attributes ({name!r})")


def _environment() -> _MemoSandbox:
    env = _MemoSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(
        raise_exception=_raise_exception, strftime_now=_strftime_now, dict=_TemplateDict(), namespace=_TemplateNamespace
    )
    return env


def _plain(value: Any) -> Any:
    """transformers' ``_plain_template_data`` for JSON data (a fresh copy); anything else: ``NotPlain``."""
    kind = type(value)
    if value is None or kind is str or kind is int or kind is float or kind is bool:
        return value
    if kind is dict:
        return {_plain(k): _plain(v) for k, v in value.items()}
    if kind is list:
        return [_plain(v) for v in value]
    if kind is tuple:
        return tuple(_plain(v) for v in value)
    raise NotPlain(kind.__name__)


def _plain_message(message: object) -> dict[str, Any]:
    """One message as the template sees it, in one pass: transformers drops its None values
    (``_normalize_chat_messages``), rebuilds it from plain types (``_plain_template_data``) and fills the
    reasoning aliases (``_alias_reasoning_fields``: ``thinking`` first, ``reasoning_content`` last, the key
    order is theirs and templates may iterate it). Strings, most values, skip the function call."""
    if type(message) is not dict:
        raise NotPlain(type(message).__name__)
    out = {}
    for key, value in message.items():
        if value is not None:
            out[key if type(key) is str else _plain(key)] = value if type(value) is str else _plain(value)
    reasoning = out.get("reasoning_content")
    if reasoning is None:
        reasoning = out.get("thinking")
    if reasoning is None:
        reasoning = out.get("reasoning")  # _REASONING_FIELDS, in order
    if reasoning is None:
        return out
    return {"thinking": reasoning, **out, "reasoning_content": reasoning}


class FastTemplate:
    """One chat template compiled in ``_MemoSandbox``; ``render`` is ``apply_chat_template(tokenize=False)``."""

    def __init__(self, source: str, special_tokens: Mapping[str, str]) -> None:
        self._source = source
        self._template = _environment().from_string(source)
        self._special = dict(special_tokens)  # {"eos_token": "<|im_end|>", ...}: read once, fixed after load

    @classmethod
    def of(cls, tokenizer: HfRenderer) -> FastTemplate | None:
        """The fast template of ``tokenizer``, or None (no single template, or one that does not compile)."""
        source = tokenizer.chat_template
        if not isinstance(source, str):
            return None  # none, or a dict of named templates: the reference picks among them
        try:
            return cls(source, getattr(tokenizer, "special_tokens_map", {}))
        except jinja2.TemplateError as exc:
            log.info("chat template does not compile (%s): rendered by apply_chat_template", exc)
            return None

    def render(
        self,
        conversation: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        documents: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool | str = False,
        **kwargs: Any,
    ) -> str:
        """The rendered chat. Raises what the template raises, ``ValueError``/``TypeError`` where transformers
        would, and ``NotPlain`` for data that is not plain JSON (callers then use the reference)."""
        if not conversation:
            raise ValueError("Cannot apply chat template to an empty conversation.")
        if continue_final_message and add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt are not compatible.")
        if tools is not None and any(type(t) is not dict for t in tools):
            raise NotPlain("tool")
        if documents is not None and any(type(d) is not dict for d in documents):
            raise TypeError("Documents should be a list of dicts with 'title' and 'text' keys!")
        chat = [_plain_message(m) for m in conversation]
        variables = _plain({**self._special, **kwargs})
        if not continue_final_message:
            return self._template.render(
                messages=chat, tools=_plain(tools), documents=_plain(documents),
                add_generation_prompt=add_generation_prompt, **variables,
            )  # fmt: skip
        field = continue_final_message if isinstance(continue_final_message, str) else "content"
        final = self._tag_final(chat, field)
        rendered = self._template.render(
            messages=chat, tools=_plain(tools), documents=_plain(documents), add_generation_prompt=False, **variables
        )
        return _cut_at_tag(rendered, final)

    def _tag_final(self, chat: list[dict[str, Any]], field: str) -> str:
        """transformers' continue_final_message: append the tag to the final message's field (every reasoning
        alias holding the same value), or to its last text block; the text to continue."""
        final = chat[-1].get(field)
        if final is None:
            raise ValueError(f"continue_final_message is set but the final message has no {field!r}")
        fields = [field]
        if field in _REASONING_FIELDS:
            fields = [f for f in _REASONING_FIELDS if chat[-1].get(f) == final]
        if not any(f in self._source for f in fields):
            raise ValueError(f"continue_final_message is set to {field!r}, not a field of the chat template")
        if isinstance(final, list | tuple):
            for block in reversed(final):
                if "text" in block:
                    final = block["text"]
                    block["text"] = block["text"] + _CONTINUE_TAG
                    return str(final)
            raise ValueError("continue_final_message is set but the final message has no text to continue")
        for f in fields:
            chat[-1][f] = chat[-1][f] + _CONTINUE_TAG
        return str(final)


def _cut_at_tag(rendered: str, final: str) -> str:
    tag = _CONTINUE_TAG.strip()
    if final.strip() not in rendered or tag not in rendered:
        raise ValueError("continue_final_message is set but the final message does not appear in the chat")
    at = rendered.rindex(tag)
    if rendered[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return rendered[:at]
    return rendered[:at].rstrip()
