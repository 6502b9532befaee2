"""Long texts encoded again from their last shared *checkpoint*: a document asked again with a new question.

The fast encoder's segment cache reuses the text between added tokens. A long message that changes near its
end (a document followed by a new question in the same message, a file that grows) is one such segment, and was
encoded whole on every request (~0.8 ms at 32K tokens). ``TextCheckpoints`` remembers long texts with cuts every
``interval_chars``, and the tokens before each cut. A new text that starts with a remembered one's prefix up to
a cut is encoded as those tokens followed by the encoding of its own rest.

A cut is a position ``c`` after a line break and before a letter, or after a sentence mark (``.,;:!?``) and
before a space and a letter (``CUT``). For the byte-level BPE tokenizers with GPT-style split regexes (Qwen,
Llama 3) the encoding of ``text`` is then the encoding of ``text[:c]`` followed by that of ``text[c:]``: no
pre-tokenizer piece contains either pair (a letter run may be preceded by one character that is neither a line
break nor the start of a punctuation run it ends; punctuation runs end before a space; whitespace runs end at
the line break or before it), the NFC normalizer composes nothing onto a letter or a space, and no added token
spans them. That is an argument about some tokenizer.json files, not all (SentencePiece's Metaspace prepends a
space to the text after the cut), so it is checked per model: ``cut_difference`` encodes the start-up check
corpus whole and cut at every such position, and a model that differs once runs without checkpoints. The shadow
check (``shadow.ShadowCheck``) re-encodes sampled live requests with HF tokenizers, checkpoints included.

Lookup: texts are filed under their first ``_KEY_CHARS`` characters (before the first cut, so every text that
shares a cut shares the key); the deepest cut a new text shares is a bisection of compares (memory compares, no
hashing). A text is encoded in pieces (and remembered) only on its key's second sighting sharing a cut with the
first: encoding in pieces costs more than whole, and a unique document never repeats. Bounded by ``max_bytes``
(least recently used texts go first), and the first sightings (held by reference) by ``_SEEN`` texts and a
quarter of ``max_bytes`` in characters; thread-safe.
"""

from __future__ import annotations

import re
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from extproc.keyed_lru import KeyedLru

__all__ = ["CUT", "CheckpointStats", "TextCheckpoints", "cut_difference"]

CUT = re.compile(r"[\r\n](?=[^\W\d_])|[.,;:!?](?= [^\W\d_])")
"""After a line break followed by a letter, or after a sentence mark followed by a space and a letter: the cut is
at the match's end."""
_KEY_CHARS = 1024  # texts are filed under their first this many characters (cuts lie beyond)
_PER_KEY = 8  # remembered texts per key (most recently used first)
_NEW_CUTS = 2  # a text is remembered when it has this many cuts past the remembered one it shares most with
_SEEN = 64  # texts seen once (by reference, no copy), the most recent first sighting per key
_TEXT_OVERHEAD_BYTES = 400  # record, lists, dict slots: a rough per-text cost beyond its characters and ids

Encode = Callable[[str], "array[int]"]


@dataclass(eq=False, slots=True)
class _Text:
    text: str
    cuts: list[int]  # checkpoint positions, ascending, each past _KEY_CHARS
    counts: list[int]  # tokens of text[: cuts[i]]
    ids: array[int]  # tokens of the whole text


@dataclass
class CheckpointStats:
    """Counters since start: texts encoded from a checkpoint (``hits``) or whole (``misses``), the tokens taken
    from checkpoints and those encoded; the remembered texts and their bytes now."""

    hits: int = 0
    misses: int = 0
    reused_tokens: int = 0
    encoded_tokens: int = 0
    entries: int = 0
    bytes: int = 0


class TextCheckpoints:
    """Remembered long texts and their tokens at cuts (module docstring); ``encode`` is exact where ``encode_whole``
    (the fast encoder without special tokens) obeys ``CUT``, which ``cut_difference`` checks."""

    def __init__(
        self, encode_whole: Encode, *, max_bytes: int, min_chars: int = 16384, interval_chars: int = 4096
    ) -> None:
        if interval_chars <= _KEY_CHARS or min_chars < interval_chars:
            raise ValueError("checkpoints need interval_chars > 1024 and min_chars >= interval_chars")
        self._encode = encode_whole
        self._max_bytes = max_bytes
        self._min_chars = min_chars
        self._interval = interval_chars
        self._texts: KeyedLru[str, _Text] = KeyedLru(max_bytes, _PER_KEY)  # filed under their first _KEY_CHARS
        self._seen: OrderedDict[str, str] = OrderedDict()  # {key: the last text seen once under it}, oldest first
        self._seen_chars = 0  # their characters, within max_bytes // 4 (held by reference: a body's own text)
        self._lock = threading.Lock()
        self.stats = CheckpointStats()

    def encode(self, text: str) -> array[int]:
        """The tokens of ``text`` (no special tokens added): from the deepest remembered cut it shares, then its
        own rest encoded piece by piece at its own cuts (each piece at most ``interval_chars`` past one)."""
        if len(text) < self._min_chars:
            return self._encode(text)
        key = text[:_KEY_CHARS]
        with self._lock:
            base, at = self._deepest(key, text)
            first_sighting = base is None and not self._seen_before(key, text)
        if first_sighting:  # encoded whole (one call), its cuts made on the second sighting
            ids = self._encode(text)
            with self._lock:
                self.stats.misses += 1
                self.stats.encoded_tokens += len(ids)
            return ids
        if base is None:
            cuts, counts, ids = [], [], array("I")
        else:
            cuts, counts = base.cuts[: at + 1], base.counts[: at + 1]
            ids = base.ids[: counts[-1]]
        start = cuts[-1] if cuts else 0
        reused, shared = len(ids), len(cuts)
        for cut in [*self._cuts(text, start), len(text)]:
            ids += self._encode(text[start:cut])
            if cut < len(text):
                cuts.append(cut)
                counts.append(len(ids))
            start = cut
        self._remember(_Text(text, cuts, counts, ids), key, base, reused, len(cuts) - shared)
        return ids

    def fresh_chars(self, text: str) -> int:
        """The characters of ``text`` past the deepest remembered cut it shares (all of them when none): what
        ``encode`` would encode now. A bisection of compares, no encoding; it marks that text used."""
        if len(text) < self._min_chars:
            return len(text)
        with self._lock:
            base, at = self._deepest(text[:_KEY_CHARS], text)
        return len(text) - base.cuts[at] if base is not None else len(text)

    def _seen_before(self, key: str, text: str) -> bool:
        """Whether a text with ``text``'s key and its first cut was seen (and not remembered) before; remembers
        ``text`` as the key's last sighting otherwise. Pieces and checkpoints cost a few tenths of a millisecond
        over encoding whole: a text nothing else shares (a unique document) never pays them. Under the lock."""
        first = CUT.search(text, self._interval)
        last = self._seen.pop(key, None)
        if last is not None:
            self._seen_chars -= len(last)
            if first is not None and last.startswith(text[: first.end()]):
                return True
        self._seen[key] = text
        self._seen_chars += len(text)
        while len(self._seen) > _SEEN or self._seen_chars > self._max_bytes // 4:
            self._seen_chars -= len(self._seen.popitem(last=False)[1])
        return False

    def clear(self) -> None:
        """Forget every remembered text and reset the counters (the budget stays), e.g. between benchmark shapes."""
        with self._lock:
            self._texts.clear()
            self._seen.clear()
            self._seen_chars = 0
            self.stats = CheckpointStats()

    def _deepest(self, key: str, text: str) -> tuple[_Text | None, int]:
        """The remembered text whose cut ``text`` shares deepest, and that cut's index (a letter must follow it in
        ``text`` too). Under the lock."""
        best: _Text | None = None
        best_at = -1
        for known in self._texts.under(key):
            at = _shared_cuts(text, known) - 1
            while at >= 0 and not _letter_at(text, known.cuts[at]):
                at -= 1
            if at >= 0 and (best is None or known.cuts[at] > best.cuts[best_at]):
                best, best_at = known, at
                if at == len(known.cuts) - 1:
                    break  # shares every cut of the most recently used text: as deep as it gets, in practice
        if best is not None:
            self._texts.used(best)
        return best, best_at

    def _cuts(self, text: str, start: int) -> list[int]:
        """Cuts of ``text`` after ``start``, each the first at least ``interval_chars`` past the one before."""
        cuts, at = [], start
        while (match := CUT.search(text, at + self._interval)) is not None and match.end() < len(text):
            at = match.end()
            cuts.append(at)
        return cuts

    def _remember(self, record: _Text, key: str, base: _Text | None, reused: int, new_cuts: int) -> None:
        size = 2 * len(record.text) + 4 * len(record.ids) + 16 * len(record.cuts) + _TEXT_OVERHEAD_BYTES
        with self._lock:
            stats = self.stats
            stats.hits += base is not None
            stats.misses += base is None
            stats.reused_tokens += reused
            stats.encoded_tokens += len(record.ids) - reused
            if new_cuts >= _NEW_CUTS:  # a text that added fewer is encoded from the cuts it shares anyway
                # a text that grew replaces what it extends
                grew_from = base if base is not None and record.text.startswith(base.text) else None
                self._texts.add(key, record, size, replaces=grew_from)
            stats.bytes, stats.entries = self._texts.bytes, len(self._texts)


def _shared_cuts(text: str, known: _Text) -> int:
    """How many of ``known``'s cuts ``text`` shares (starts with ``known.text`` up to them): a bisection that
    compares each stretch of text once it is known to match up to its start (~2x the text, not log x)."""
    cuts, other = known.cuts, known.text
    lo, hi, matched = 0, len(cuts), 0  # cuts[:lo] shared, cuts[hi:] not; text[:matched] == other[:matched]
    if hi and text[: cuts[-1]] == other[: cuts[-1]]:
        return hi
    while lo < hi:
        mid = (lo + hi) // 2
        if text[matched : cuts[mid]] == other[matched : cuts[mid]]:
            lo, matched = mid + 1, cuts[mid]
        else:
            hi = mid
    return lo


def _letter_at(text: str, at: int) -> bool:
    return at < len(text) and CUT.match(text, at - 1) is not None


def cut_difference(encode_whole: Encode, texts: Iterable[str]) -> str | None:
    """None when ``encode_whole`` (no special tokens) encodes every text as its parts before and after each of its
    ``CUT`` positions; else the first difference, described without the text."""
    for i, text in enumerate(texts):
        whole = list(encode_whole(text))
        for match in CUT.finditer(text):
            cut = match.end()
            parts = list(encode_whole(text[:cut])) + list(encode_whole(text[cut:]))
            if parts != whole:
                return f"corpus text {i} ({len(text)} chars) cut at {cut}: {len(parts)} vs {len(whole)} tokens"
    return None
