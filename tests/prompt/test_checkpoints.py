"""TextCheckpoints' bookkeeping, on an encoder for which every position is a cut (one id per character)."""

from __future__ import annotations

from array import array

import pytest

from extproc.observability import TokenizerCollector
from extproc.prompt.checkpoints import CUT, CheckpointStats, TextCheckpoints, cut_difference


class PerChar:
    """One id per character: the parts of any cut encode as the whole. Counts the characters it encodes."""

    def __init__(self) -> None:
        self.encoded = 0

    def __call__(self, text: str) -> array[int]:
        self.encoded += len(text)
        return array("I", map(ord, text))


def document(paragraphs: int, salt: str = "") -> str:
    return "".join(f"Paragraph {salt}{i}: the figures moved, as the table shows.\n" for i in range(paragraphs))


def test_a_new_question_after_a_long_document_encodes_only_past_the_last_shared_cut() -> None:
    encoder = PerChar()
    checkpoints = TextCheckpoints(encoder, max_bytes=1 << 20, min_chars=4096, interval_chars=2048)
    doc = document(400)  # ~22K characters
    for question in ("Question 0: what moved?", "Question 1: where?"):  # seen once (whole), then cut and remembered
        assert list(checkpoints.encode(doc + question)) == list(map(ord, doc + question))
    encoder.encoded = 0
    third = checkpoints.encode(doc + "Question 2: and why?")
    assert list(third) == list(map(ord, doc + "Question 2: and why?"))
    assert encoder.encoded < 2048 + 64  # at most one interval and the question
    stats = checkpoints.stats
    assert (stats.hits, stats.misses, stats.entries) == (1, 2, 1)  # the third added no cuts: not remembered


def test_fresh_chars_says_what_encode_would_encode_afresh() -> None:
    encoder = PerChar()
    checkpoints = TextCheckpoints(encoder, max_bytes=1 << 20, min_chars=4096, interval_chars=2048)
    doc = document(400)
    assert checkpoints.fresh_chars("short") == 5
    assert checkpoints.fresh_chars(doc + "Question 0?") == len(doc) + 11  # nothing remembered yet
    for question in ("Question 0: what moved?", "Question 1: where?"):
        checkpoints.encode(doc + question)
    text = doc + "Question 2: and why?"
    fresh = checkpoints.fresh_chars(text)
    assert 0 < fresh < 2048 + 64 and encoder.encoded == 2 * len(doc) + 41  # it encoded nothing itself
    encoder.encoded = 0
    checkpoints.encode(text)
    assert encoder.encoded == fresh  # exactly what it said
    assert checkpoints.fresh_chars(document(400, salt="other")) == len(document(400, salt="other"))


def test_a_unique_text_is_encoded_whole_in_one_call() -> None:
    calls: list[int] = []

    def counted(text: str) -> array[int]:
        calls.append(len(text))
        return array("I", map(ord, text))

    checkpoints = TextCheckpoints(counted, max_bytes=1 << 20, min_chars=4096, interval_chars=2048)
    for salt in ("a", "b", "c"):
        text = document(400, salt=salt)
        assert list(checkpoints.encode(text)) == list(map(ord, text))
    assert calls == [len(document(400, salt=s)) for s in "abc"] and checkpoints.stats.entries == 0
    assert checkpoints.stats.encoded_tokens == sum(calls) and checkpoints.stats.reused_tokens == 0


def test_a_growing_text_replaces_what_it_extends() -> None:
    checkpoints = TextCheckpoints(PerChar(), max_bytes=1 << 20, min_chars=4096, interval_chars=2048)
    text = document(100)
    for turn in range(5):
        text += document(100, salt=f"t{turn}-")
        assert list(checkpoints.encode(text)) == list(map(ord, text))
    assert checkpoints.stats.entries == 1 and (checkpoints.stats.hits, checkpoints.stats.misses) == (3, 2)


def test_short_texts_and_texts_without_cuts_are_encoded_whole() -> None:
    encoder = PerChar()
    checkpoints = TextCheckpoints(encoder, max_bytes=1 << 20, min_chars=4096, interval_chars=2048)
    for text in ("short\ntext", "x" * 10_000, "word " * 3000):
        assert list(checkpoints.encode(text)) == list(map(ord, text))
    assert checkpoints.stats.entries == 0


def test_a_cut_needs_its_letter_in_the_new_text_too() -> None:
    checkpoints = TextCheckpoints(PerChar(), max_bytes=1 << 20, min_chars=4096, interval_chars=2048)
    doc = document(200)
    checkpoints.encode(doc + "Tail.")
    cut = next(m.end() for m in CUT.finditer(doc) if m.end() > 8000)
    edited = doc[:cut] + "1 " + doc[cut:]  # a digit where the cut's letter was
    assert list(checkpoints.encode(edited)) == list(map(ord, edited))


def test_the_budget_and_the_per_key_limit_hold() -> None:
    checkpoints = TextCheckpoints(PerChar(), max_bytes=200_000, min_chars=4096, interval_chars=2048)
    head = document(60)  # past the first cut: each text shares it with the others
    for n in range(40):
        checkpoints.encode(head + document(150, salt=f"{n}-"))
    assert 0 < checkpoints.stats.bytes <= 200_000
    assert checkpoints.stats.entries <= 8


def test_cut_difference_names_the_first_text_a_cut_changes() -> None:
    def merges_line_starts(text: str) -> array[int]:  # "\nX" is one id: no cut after a line break
        out, i = array("I"), 0
        while i < len(text):
            if text[i] == "\n" and i + 1 < len(text):
                out.append(0x10000 + ord(text[i + 1]))
                i += 2
            else:
                out.append(ord(text[i]))
                i += 1
        return out

    assert cut_difference(PerChar(), ["a\nb. c", "no cut"]) is None
    assert cut_difference(merges_line_starts, ["plain", "a\nb"]) == "corpus text 1 (3 chars) cut at 2: 3 vs 2 tokens"


@pytest.mark.parametrize(("min_chars", "interval"), [(1000, 1000), (4096, 1024)])
def test_settings_that_cannot_work_are_refused(min_chars: int, interval: int) -> None:
    with pytest.raises(ValueError, match="interval_chars"):
        TextCheckpoints(PerChar(), max_bytes=1, min_chars=min_chars, interval_chars=interval)


def test_the_counters_are_exported_per_model() -> None:
    stats = CheckpointStats(hits=3, misses=1, reused_tokens=90_000, encoded_tokens=2_000, entries=1, bytes=400_000)
    collector = TokenizerCollector(list, dict, list, list, lambda: {"m": stats})
    samples = {(s.name, s.labels.get("model")): s.value for f in collector.collect() for s in f.samples}
    assert samples[("router_tokenizer_checkpoints_hits_total", "m")] == 3
    assert samples[("router_tokenizer_checkpoints_reused_tokens_total", "m")] == 90_000
    assert samples[("router_tokenizer_checkpoints_bytes", "m")] == 400_000


def test_first_sightings_are_bounded_in_characters() -> None:
    checkpoints = TextCheckpoints(PerChar(), max_bytes=100_000, min_chars=4096, interval_chars=2048)
    for salt in range(20):  # ~22K characters each, a different key each: 20 first sightings
        checkpoints.encode(f"{salt} " + document(400))
    assert checkpoints._seen_chars <= 25_000 and len(checkpoints._seen) == 1
