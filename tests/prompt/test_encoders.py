"""The encoder seam with fakes: the self-check, the live shadow check, and how a model falls back to HF."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

import pytest

from bench.stack_config import REPO
from extproc.prompt.encoders import ENCODER_HF, EncoderChoice, HfEncoder, check_corpus, self_check
from extproc.prompt.models import BaseModel
from extproc.prompt.shadow import ShadowCheck
from extproc.prompt.tokenizers import EncoderSettings, TokenizerRegistry


class Words:
    """Encodes each word as its length; ``wrong_on`` words come out one longer (a fast encoder's bug)."""

    def __init__(self, name: str = "fake", wrong_on: str | None = None) -> None:
        self.name, self.wrong_on, self.calls = name, wrong_on, 0

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        self.calls += 1
        ids = [len(w) + (w == self.wrong_on) for w in text.split()]
        return ([1] if add_special_tokens else []) + ids


class Inline(Executor):
    """Runs submitted work at once; ``hold`` keeps it queued instead (never run)."""

    def __init__(self, hold: bool = False) -> None:
        self.hold, self.held = hold, 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        if self.hold:
            self.held += 1
            return future
        future.set_result(fn(*args, **kwargs))
        return future


def test_self_check_finds_the_first_difference_without_quoting_text() -> None:
    assert self_check(Words(), Words(), ["a bb", "ccc"]) is None
    found = self_check(Words(wrong_on="secret"), Words(), ["fine", "my secret"])
    assert found is not None and "corpus text 1" in found and "secret" not in found


def test_the_corpus_covers_every_added_token_with_whitespace_on_both_sides() -> None:
    corpus = check_corpus(["<|x|>"])
    assert {"<|x|>b", "x<|x|>b", " <|x|> b", "\n<|x|>\n\n"} <= set(corpus)
    assert check_corpus(["<|x|>"]) == corpus  # seeded: the same at every start


def test_a_choice_uses_the_fast_encoder_until_it_falls_back() -> None:
    fast, ref = Words("fast"), Words("ref")
    choice = EncoderChoice("m", ref, fast)
    assert choice.name == "fast" and choice.encode("a bb", add_special_tokens=False) == [1, 2]
    choice.fall_back("test")
    choice.fall_back("a later reason is not kept")
    assert choice.name == "ref" and choice.fallback_reason == "test"


def test_a_live_mismatch_is_counted_and_switches_the_model_to_hf() -> None:
    results: list[tuple[str, bool]] = []
    shadow = ShadowCheck(1.0, Inline(), on_result=lambda m, check, ok: results.append((f"{m}/{check}", ok)))
    choice = EncoderChoice("m", Words("ref"), Words("fast", wrong_on="odd"), shadow=shadow)
    choice.encode("all good", add_special_tokens=False)
    assert results == [("m/encoder", True)] and choice.name == "fast"
    ids = choice.encode("an odd one", add_special_tokens=True)
    assert ids == [1, 2, 4, 3]  # this request keeps what it got; the model moves on
    assert (
        results[-1] == ("m/encoder", False)
        and choice.name == "ref"
        and "live request" in (choice.fallback_reason or "")
    )
    choice.encode("after", add_special_tokens=False)
    assert len(results) == 2  # nothing is re-checked once on the reference


def test_the_shadow_check_samples_and_never_queues_more_than_its_bound() -> None:
    never = ShadowCheck(0.0, Inline())
    choice = EncoderChoice("m", Words("ref"), Words("fast"), shadow=never)
    choice.encode("x", add_special_tokens=False)
    assert choice.reference.calls == 0  # type: ignore[attr-defined]
    stuck = Inline(hold=True)
    bounded = EncoderChoice("m", Words("ref"), Words("fast"), shadow=ShadowCheck(1.0, stuck, max_pending=3))
    for _ in range(10):
        bounded.encode("x", add_special_tokens=False)
    assert stuck.held == 3


def test_a_tokenizer_that_fails_its_self_check_runs_on_hf() -> None:
    settings = EncoderSettings(make_fast=lambda tokenizer, cache_bytes, head: _Differs(HfEncoder(tokenizer)))
    registry = TokenizerRegistry(REPO / "tokenizer_cache", encoders=settings)
    choice = registry.get(BaseModel("Qwen/Qwen3-0.6B")).encoder
    assert choice.name == ENCODER_HF and "start-up self-check" in (choice.fallback_reason or "")
    unavailable = TokenizerRegistry(REPO / "tokenizer_cache", encoders=EncoderSettings(make_fast=lambda t, b, h: None))
    assert unavailable.get(BaseModel("Qwen/Qwen3-0.6B")).encoder.name == ENCODER_HF


class _Differs:
    """HF's answer with one extra token on texts that hold a digit: a plausible fast-encoder bug."""

    name = "fastokens"

    def __init__(self, hf: HfEncoder) -> None:
        self._hf = hf

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        ids = list(self._hf.encode(text, add_special_tokens=add_special_tokens))
        return [*ids, 0] if any(c.isdigit() for c in text) else ids


def test_the_shadow_checks_stay_within_their_cpu_budget() -> None:
    """A token bucket of CPU seconds: each check pays what it cost; an empty bucket skips (counted) until the
    share of wall time it refills at has paid the debt back."""
    now, spent = [0.0], [0.0]
    skipped: list[str] = []

    class Costly(Words):
        def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
            spent[0] += 0.1  # each reference encode costs 100 ms of CPU
            return super().encode(text, add_special_tokens=add_special_tokens)

    shadow = ShadowCheck(1.0, Inline(), on_skip=lambda m, check: skipped.append(m), max_cpu_share=0.01, burst_s=0.05,
                         clock=lambda: now[0], cpu_clock=lambda: spent[0])  # fmt: skip
    choice = EncoderChoice("m", Costly("ref"), Words("fast"), shadow=shadow)
    choice.encode("a", add_special_tokens=False)  # the bucket held 0.05 s: checked, now 0.05 s in debt
    choice.encode("b", add_special_tokens=False)
    assert spent[0] == pytest.approx(0.1) and skipped == ["m"]
    now[0] = 5.0  # 5 s at 1% refills exactly the debt: still nothing to spend
    choice.encode("c", add_special_tokens=False)
    assert skipped == ["m", "m"]
    now[0] = 6.0
    choice.encode("d", add_special_tokens=False)
    assert spent[0] == pytest.approx(0.2) and len(skipped) == 2
