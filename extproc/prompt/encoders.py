"""Text -> token ids behind one seam: HF ``tokenizers`` (the reference vLLM uses) or a faster exact encoder.

vLLM tokenizes with the HF tokenizer ``transformers`` loads; that stays our reference and our fallback. A
faster encoder (``fastokens``: Rust, the same ``tokenizer.json``) is used only once it is shown equal:

- ``FastEncoder.from_hf`` builds it from the HF backend's own serialization (``backend.to_str()``), so it sees
  the normalizer, pre-tokenizer, model and added vocabulary exactly as ``transformers`` configured them (a
  ``NativeHeadStart`` may have loaded the folder's ``tokenizer.json`` meanwhile: it is used only when everything
  in it that decides the ids equals that serialization, ``encoding_spec``);
- ``self_check`` compares both on a corpus (``check_corpus``: adversarial text and every added token) at load;
  a tokenizer that differs once runs on HF;
- ``shadow.ShadowCheck`` re-encodes a sampled fraction of live requests with HF on a background thread, off the hot
  path; a mismatch is counted, logged, and switches that model to HF for good. The same machinery checks the
  fast chat-template renderer (``templates.py``): anything ``Verified`` can be offered to it.

Both encoders return ``TokenIds``: the fast one an ``array('I')`` (built from one flat buffer, no per-token
Python object), HF a ``list``. Either is a ``Sequence[int]`` of plain ints, which is what hashing needs.
"""

from __future__ import annotations

import json
import logging
import random
import threading
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from extproc.prompt.checkpoints import CheckpointStats, TextCheckpoints
from extproc.prompt.shadow import ShadowCheck

__all__ = [
    "ENCODER_FAST",
    "ENCODER_HF",
    "EncoderChoice",
    "FastEncoder",
    "HfEncoder",
    "NativeHeadStart",
    "TextEncoder",
    "TokenIds",
    "check_corpus",
    "encoding_spec",
    "self_check",
]

log = logging.getLogger(__name__)

TokenIds = Sequence[int]
ENCODER_HF = "hf"
ENCODER_FAST = "fastokens"


class TextEncoder(Protocol):
    """Encodes rendered prompt text; ``add_special_tokens`` as in HF (BOS/EOS from the post-processor)."""

    @property
    def name(self) -> str: ...

    def encode(self, text: str, *, add_special_tokens: bool) -> TokenIds: ...

    def fresh_chars(self, text: str) -> int:
        """How many of ``text``'s characters encoding it now would encode afresh, as far as the encoder knows
        without encoding (``len(text)`` when it knows nothing): where the work should run."""
        ...


class _HfCallable(Protocol):
    def __call__(self, text: str, **kwargs: Any) -> Any: ...


class HfEncoder:
    """The reference: ``tokenizer(text, add_special_tokens=...)["input_ids"]`` as ``transformers`` computes it."""

    name = ENCODER_HF

    def __init__(self, tokenizer: _HfCallable) -> None:
        self._tokenizer = tokenizer

    def encode(self, text: str, *, add_special_tokens: bool) -> TokenIds:
        result = self._tokenizer(text, add_special_tokens=add_special_tokens)
        ids = result["input_ids"] if hasattr(result, "keys") else result
        return list(map(int, ids))

    def fresh_chars(self, text: str) -> int:
        return len(text)  # no cache of ours in front of it


class FastEncoder:
    """``fastokens`` over the HF backend's serialization; thread-safe, releases the GIL while encoding.

    ``segment_cache_bytes`` > 0 turns on its segment cache (text between added tokens, reused across
    requests; stated identical to encoding without it, and covered by ``self_check`` and ``ShadowCheck`` like
    everything else). ``enable_checkpoints`` turns on ours for long texts that change near their end
    (``checkpoints.py``).
    """

    name = ENCODER_FAST

    def __init__(self, native: Any) -> None:
        self._native = native
        self._checkpoints: TextCheckpoints | None = None

    @classmethod
    def from_hf(
        cls, hf_tokenizer: Any, *, segment_cache_bytes: int = 0, head_start: NativeHeadStart | None = None
    ) -> FastEncoder | None:
        """The fast encoder for ``hf_tokenizer``, or None (fastokens missing, no Rust backend, unloadable).
        ``head_start``: the same folder's tokenizer.json loaded meanwhile, taken only if it encodes the same."""
        backend = getattr(hf_tokenizer, "_tokenizer", None)
        if backend is None or not hasattr(backend, "to_str"):
            return None  # a slow (pure Python) tokenizer: nothing to translate
        try:
            import fastokens
        except ImportError:
            return None
        try:
            serialized = backend.to_str()
            native = head_start.take(serialized) if head_start is not None else None
            if native is None:
                native = fastokens.Tokenizer.from_json_str(serialized)
            native.no_truncation()
            native.no_padding()
            if segment_cache_bytes > 0:
                native.enable_segment_cache(segment_cache_bytes)
        except Exception as exc:  # a tokenizer.json feature fastokens does not support
            log.info("fastokens cannot load this tokenizer (%s): HF tokenizers it is", exc)
            return None
        return cls(native)

    def encode(self, text: str, *, add_special_tokens: bool) -> TokenIds:
        if self._checkpoints is not None and not add_special_tokens:
            return self._checkpoints.encode(text)
        return self._encode_whole(text, add_special_tokens)

    def fresh_chars(self, text: str) -> int:
        """``text`` less what the checkpoints hold of it (the segment cache is not asked: its hits are cheap
        but unknown until encoded)."""
        if self._checkpoints is None:
            return len(text)
        return self._checkpoints.fresh_chars(text)

    def encode_whole(self, text: str) -> array[int]:
        """``text``'s tokens without special tokens, encoded in one call (no checkpoints)."""
        return self._encode_whole(text, False)

    def _encode_whole(self, text: str, add_special_tokens: bool) -> array[int]:
        flat, _offsets = self._native.encode_batch_flat([text], add_special_tokens=add_special_tokens)
        ids = array("I")
        ids.frombytes(flat)  # little-endian uint32, as documented; this machine's order (checked at import)
        return ids

    def enable_checkpoints(self, max_bytes: int) -> None:
        """Encode long texts from the last checkpoint they share with a remembered one (``max_bytes`` of them; 0:
        off). Only for an encoder that ``checkpoints.cut_difference`` found no difference for."""
        self._checkpoints = TextCheckpoints(self.encode_whole, max_bytes=max_bytes) if max_bytes > 0 else None

    def checkpoint_stats(self) -> CheckpointStats | None:
        """The checkpoints' counters, or None when they are off."""
        return self._checkpoints.stats if self._checkpoints is not None else None

    def clear_cache(self) -> None:
        """Empty the segment cache and the checkpoints (keeping their budgets), e.g. between benchmark shapes."""
        stats = self.cache_stats()
        if stats is not None:
            self._native.enable_segment_cache(stats["max_bytes"])
        if self._checkpoints is not None:
            self._checkpoints.clear()

    def cache_stats(self) -> dict[str, int] | None:
        """The segment cache's counters (hits, misses, hit_bytes, miss_bytes, entries, bytes, max_bytes)."""
        stats: dict[str, int] | None = self._native.segment_cache_stats()
        return stats


def encoding_spec(serialized: str) -> Any:
    """What in a serialized ``tokenizers`` tokenizer decides the ids of an encoding: all of it but the decoder,
    the padding and truncation (the fast encoder turns both off) and ``trim_offsets`` (offsets only), which are
    what ``transformers`` rewrites at load (Qwen3: ByteLevel's ``trim_offsets`` and the decoder)."""
    spec = json.loads(serialized)
    for key in ("decoder", "padding", "truncation"):
        spec.pop(key, None)
    for key in ("pre_tokenizer", "post_processor"):  # where ``trim_offsets`` lives (ByteLevel, RobertaProcessing)
        if spec.get(key) is not None:
            spec[key] = _without_trim_offsets(spec[key])
    return spec


def _without_trim_offsets(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_trim_offsets(v) for k, v in node.items() if k != "trim_offsets"}
    if isinstance(node, list):
        return [_without_trim_offsets(v) for v in node]
    return node


class NativeHeadStart:
    """A fastokens tokenizer loading a folder's ``tokenizer.json`` on its own thread while ``transformers``
    loads the folder: the Rust load releases the GIL, so its ~1.8 s (Qwen3, 2 cores) overlaps the
    ``transformers`` import instead of following it. ``take`` hands it over only when ``encoding_spec`` of the file
    equals that of the HF backend's serialization; otherwise (or if the load failed) None, and the fast encoder
    is built from the HF serialization as without a head start."""

    def __init__(self, tokenizer_json: Path) -> None:
        self._path = tokenizer_json
        self._native: Any = None
        self._spec: Any = None
        self._thread = threading.Thread(target=self._load, name="fastokens-head-start", daemon=True)
        self._thread.start()

    @classmethod
    def for_folder(cls, folder: Path) -> NativeHeadStart | None:
        """A head start on ``folder/tokenizer.json``, or None when there is none (or fastokens is missing)."""
        path = folder / "tokenizer.json"
        try:
            import fastokens  # noqa: F401
        except ImportError:
            return None
        return cls(path) if path.is_file() else None

    def _load(self) -> None:
        try:
            import fastokens

            text = self._path.read_text(encoding="utf-8")
            native = fastokens.Tokenizer.from_json_str(text)
            self._spec, self._native = encoding_spec(text), native
        except Exception as exc:  # unreadable, or a feature fastokens lacks: from_hf decides without us
            log.debug("fastokens head start on %s failed: %s", self._path, exc)

    def take(self, serialized: str) -> Any:
        """The loaded tokenizer if it encodes as ``serialized`` describes, else None (waits for the load)."""
        self._thread.join()
        if self._native is None or self._spec != encoding_spec(serialized):
            return None
        native, self._native = self._native, None  # handed over once
        return native


def check_corpus(added_tokens: Iterable[str], *, seed: int = 0, count: int = 400) -> list[str]:
    """Texts on which a fast encoder must equal HF before it is trusted: fixed hard cases, every added token
    alone and glued to text, and ``count`` seeded random mixes of the character classes tokenizers split on
    (whitespace runs, newlines, digits, punctuation, accents, CJK, emoji, contractions, added-token look-alikes).
    """
    added = [t for t in added_tokens if t]
    fixed = [
        "", " ", "  ", "\n", "\n\n\n", "\t \n ", "a", " a", "a ", "Hello, world!", "don't I'll we've",
        "1234567890 3.14159 1,000,000", "naïve café résumé Ångström", "日本語のテキスト、中文文本。",
        "emoji 😀👍🏽 family 👨‍👩‍👧", "<|im_start|> not quite", "<|fake|>", "a\u00a0b\u200bc", "\r\n\r\n",
        "    indented code:\n\tdef f(x):\n\t\treturn x  # comment", "x" * 300, " " * 64 + "end", "ﬁ ﬂ Ⅻ ①",
    ]  # fmt: skip
    # whitespace on both sides too: an added token's lstrip/rstrip flags eat it, and must eat it alike
    glued = [f"{a}{t}{b}" for t in added for a, b in (("", "b"), ("x", "b"), (" ", " b"), ("\n", "\n\n"))]
    rng = random.Random(seed)
    pieces = [" ", "  ", "\n", "\n\n", "\t", "word", "Word", "WORD", "42", "7", "3.5", ",", ".", "!?", "'s",
              "'ll", "é", "ü", "中文", "テスト", "😀", "👍🏽", "--", "()", "{}", "<", ">", "|", "_", "\u00a0", "’",
              "ß"]  # fmt: skip
    pieces += added
    mixes = ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 40))) for _ in range(count)]
    return fixed + glued + mixes


def self_check(fast: TextEncoder, reference: TextEncoder, texts: Iterable[str]) -> str | None:
    """None when ``fast`` equals ``reference`` on every text, with and without special tokens; else the first
    difference, described without the text itself (prompts may be private, this corpus is not, but the
    message format is shared with ``ShadowCheck``)."""
    for i, text in enumerate(texts):
        for special in (False, True):
            ours, ref = (
                fast.encode(text, add_special_tokens=special),
                reference.encode(text, add_special_tokens=special),
            )
            if list(ours) != list(ref):
                return (
                    f"corpus text {i} ({len(text)} chars, add_special_tokens={special}): {_first_difference(ours, ref)}"
                )
    return None


def _token_difference(ours: TokenIds, ref: TokenIds) -> str | None:
    return None if list(ours) == list(ref) else _first_difference(ours, ref)


def _first_difference(ours: Sequence[int], ref: Sequence[int]) -> str:
    at = next((i for i, (a, b) in enumerate(zip(ours, ref, strict=False)) if a != b), min(len(ours), len(ref)))
    return f"{len(ours)} vs {len(ref)} tokens, first difference at token {at}"


@dataclass
class EncoderChoice:
    """A model's encoder: the fast one while it holds up, HF otherwise; itself a ``TextEncoder``.

    Each fast encoding is offered to ``shadow`` (if any) for a sampled comparison with the reference.
    Thread-safe: ``fall_back`` only ever sets the reason once, and readers see either encoder.
    """

    model: str
    reference: TextEncoder
    fast: TextEncoder | None = None
    fallback_reason: str | None = None  # why HF is used although a fast encoder was considered
    shadow: ShadowCheck | None = None
    check: ClassVar[str] = "encoder"  # the shadow check's label for this kind of fast path

    @property
    def current(self) -> TextEncoder:
        return self.fast if self.fast is not None and self.fallback_reason is None else self.reference

    @property
    def name(self) -> str:
        return self.current.name

    def encode(self, text: str, *, add_special_tokens: bool) -> TokenIds:
        encoder = self.current
        ids = encoder.encode(text, add_special_tokens=add_special_tokens)
        if self.shadow is not None and encoder is not self.reference:
            self.shadow.offer(
                self, f"{len(text)} chars", ids,
                lambda: self.reference.encode(text, add_special_tokens=add_special_tokens), _token_difference,
            )  # fmt: skip
        return ids

    def fresh_chars(self, text: str) -> int:
        return self.current.fresh_chars(text)

    def fall_back(self, reason: str) -> None:
        if self.fallback_reason is None:
            self.fallback_reason = reason
            log.warning("model %s: the fast tokenizer disagreed with HF tokenizers (%s); using HF from now on",
                        self.model, reason)  # fmt: skip


if (
    array("I").itemsize != 4 or array("I", b"\x01\x00\x00\x00")[0] != 1
):  # pragma: no cover - big-endian or odd-int hosts are not supported
    raise ImportError("extproc.prompt.encoders assumes 4-byte little-endian unsigned ints (fastokens' flat ids)")
