"""``TokenizerRegistry`` and ``PromptTokenizer``: lazy thread-safe loads, off-loop work, timeouts, bounds."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from extproc.prompt.encoders import ENCODER_FAST
from extproc.prompt.models import BaseModel
from extproc.prompt.openai import ParsedRequest, RequestKind, parse_request
from extproc.prompt.render import ChatTokenizer
from extproc.prompt.tokenizers import EncoderSettings, PromptTokenizer, TokenizeFailed, TokenizerRegistry

MODEL = BaseModel("fake/model")


class FakeTokenizer:
    """Splits on spaces; ``delay_s`` simulates a long prompt; ``fail`` a template that raises."""

    chat_template = "{% for m in messages %}{{ m.content }} {% endfor %}"

    def __init__(self, delay_s: float = 0.0, fail: bool = False) -> None:
        self.delay_s, self.fail = delay_s, fail
        self.threads: set[str] = set()
        self.render_threads: list[str] = []

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any:
        self.render_threads.append(threading.current_thread().name)
        text = " ".join(m["content"] for m in conversation)
        return self(text)["input_ids"] if kwargs.get("tokenize") else text

    def __call__(self, text: str, **kwargs: Any) -> Any:
        self.threads.add(threading.current_thread().name)
        time.sleep(self.delay_s)
        if self.fail:
            raise RuntimeError("boom")
        return {"input_ids": [len(w) for w in text.split()]}


def fixed(tokenizer: FakeTokenizer) -> Any:
    def loader(_: Path) -> ChatTokenizer:
        return tokenizer

    return loader


def chat(content: str = "a bb ccc") -> ParsedRequest:
    raw = json.dumps({"model": "m", "messages": [{"role": "user", "content": content}]}).encode()
    return parse_request(raw, None, RequestKind.CHAT)


def completion(prompt: object) -> ParsedRequest:
    return parse_request(json.dumps({"model": "m", "prompt": prompt}).encode(), None, RequestKind.COMPLETION)


@pytest.fixture
def pool() -> Any:
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="tok-test") as executor:
        yield executor


def make(pool: ThreadPoolExecutor, tok: FakeTokenizer, **kwargs: Any) -> PromptTokenizer:
    return PromptTokenizer(TokenizerRegistry(Path("/nonexistent"), loader=fixed(tok)), pool, **kwargs)


async def test_work_runs_on_the_executor_not_the_loop(pool: ThreadPoolExecutor) -> None:
    tok = FakeTokenizer(delay_s=0.2)
    pt = make(pool, tok)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    assert await pt.render_and_tokenize(chat(), MODEL) == [1, 2, 3]
    task.cancel()
    assert ticks >= 10  # the loop kept running while the tokenizer slept
    assert tok.threads and all(name.startswith("tok-test") for name in tok.threads)


class FakeFast:
    """A "fast" encoder equal to ``FakeTokenizer``: records the thread of each encode; ``fresh`` is what it
    claims it would encode afresh."""

    name = ENCODER_FAST

    def __init__(self, reference: FakeTokenizer) -> None:
        self.reference, self.fresh, self.threads = reference, 0, []

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        self.threads.append(threading.current_thread().name)
        return list(self.reference(text)["input_ids"])

    def fresh_chars(self, text: str) -> int:
        return self.fresh


@pytest.mark.parametrize(
    ("size_hint", "fresh", "render_on_loop", "encode_on_loop"),
    [
        (50, 10**6, True, True),  # a short body: all of it on the loop, whatever is fresh
        (500, 50, True, True),  # a long body whose text is mostly known: both on the loop
        (500, 500, True, False),  # ... whose text is mostly new: rendered on the loop, encoded on a worker
        (5000, 0, False, False),  # past inline_render_bytes: all of it on a worker
    ],
)
async def test_where_a_fast_encoders_work_runs(
    pool: ThreadPoolExecutor, size_hint: int, fresh: int, render_on_loop: bool, encode_on_loop: bool
) -> None:
    tok, fast = FakeTokenizer(), []

    def make_fast(tokenizer: Any, cache_bytes: int, head: Any) -> FakeFast:
        fast.append(FakeFast(tokenizer))
        return fast[-1]

    registry = TokenizerRegistry(Path("/x"), loader=fixed(tok), encoders=EncoderSettings(make_fast=make_fast))
    pt = PromptTokenizer(registry, pool, inline_bytes=100, inline_render_bytes=1000)
    pt.preload([MODEL])  # the corpus self-check encodes too: count from here
    fast[0].fresh, fast[0].threads, tok.render_threads = fresh, [], []
    assert await pt.render_and_tokenize(chat(), MODEL, size_hint) == [1, 2, 3]
    main = threading.current_thread().name
    assert tok.render_threads[-1:] == [main] if render_on_loop else tok.render_threads[-1].startswith("tok-test")
    assert fast[0].threads == [main] if encode_on_loop else fast[0].threads[0].startswith("tok-test")


async def test_token_id_prompts_bypass_the_tokenizer(pool: ThreadPoolExecutor) -> None:
    def loader(_: Path) -> ChatTokenizer:
        raise AssertionError("must not load")

    pt = PromptTokenizer(TokenizerRegistry(Path("/x"), loader=loader), pool)
    assert await pt.render_and_tokenize(completion([5, 6, 7]), MODEL) == [5, 6, 7]
    assert await pt.render_and_tokenize(completion([[9], [1, 2]]), MODEL) == [9]  # batch: first prompt


async def test_timeout_raises_tokenize_failed(pool: ThreadPoolExecutor) -> None:
    pt = make(pool, FakeTokenizer(delay_s=0.3), timeout_s=0.05)
    with pytest.raises(TokenizeFailed, match="longer than"):
        await pt.render_and_tokenize(chat(), MODEL)


async def test_tokenizer_errors_raise_tokenize_failed(pool: ThreadPoolExecutor) -> None:
    pt = make(pool, FakeTokenizer(fail=True))
    with pytest.raises(TokenizeFailed, match="boom"):
        await pt.render_and_tokenize(chat(), MODEL)


async def test_max_pending_bounds_the_queue(pool: ThreadPoolExecutor) -> None:
    pt = make(pool, FakeTokenizer(delay_s=0.1), max_pending=2)
    results = await asyncio.gather(*(pt.render_and_tokenize(chat(), MODEL) for _ in range(4)), return_exceptions=True)
    assert sum(isinstance(r, TokenizeFailed) for r in results) == 2
    assert await pt.render_and_tokenize(chat(), MODEL) == [1, 2, 3]  # slots come back


async def test_shut_down_executor_raises_tokenize_failed() -> None:
    executor = ThreadPoolExecutor(max_workers=1)
    executor.shutdown()
    with pytest.raises(TokenizeFailed):
        await make(executor, FakeTokenizer()).render_and_tokenize(chat(), MODEL)


def test_registry_loads_each_model_once_under_concurrency() -> None:
    calls: list[Path] = []

    def loader(path: Path) -> ChatTokenizer:
        calls.append(path)
        time.sleep(0.05)
        return FakeTokenizer()

    registry = TokenizerRegistry(Path("/cache"), loader=loader)
    with ThreadPoolExecutor(max_workers=8) as executor:
        got = list(executor.map(lambda _: registry.get(MODEL), range(16)))
    assert calls == [Path("/cache/fake/model")]
    assert all(g is got[0] for g in got)


def test_registry_remembers_failures_then_retries() -> None:
    attempts = 0

    def loader(path: Path) -> ChatTokenizer:
        nonlocal attempts
        attempts += 1
        raise OSError(f"no tokenizer in {path}")

    registry = TokenizerRegistry(Path("/cache"), loader=loader, retry_after_s=0.05)
    for _ in range(3):
        with pytest.raises(TokenizeFailed, match="no tokenizer"):
            registry.get(MODEL)
    assert attempts == 1
    time.sleep(0.06)
    with pytest.raises(TokenizeFailed):
        registry.get(MODEL)
    assert attempts == 2
    assert registry.preload([MODEL]).keys() == {"fake/model"}


def test_registry_uses_the_configured_folder(tmp_path: Path) -> None:
    seen: list[Path] = []

    def loader(path: Path) -> ChatTokenizer:
        seen.append(path)
        return FakeTokenizer()

    TokenizerRegistry(Path("/cache"), loader=loader).get(BaseModel("m", tokenizer_dir=tmp_path))
    assert seen == [tmp_path]


def test_real_tokenizer_folder_missing_is_tokenize_failed(tmp_path: Path) -> None:
    with pytest.raises(TokenizeFailed, match="cannot load"):
        TokenizerRegistry(tmp_path).get(BaseModel("Qwen/Qwen3-0.6B"))


async def test_real_tokenizer_is_safe_under_concurrency(prompt_tokenizer: PromptTokenizer, qwen: BaseModel) -> None:
    """Chats and completions on one shared Qwen3 tokenizer from many threads give the sequential answers."""
    requests = [chat("The report covers revenue. " * (50 + i)) for i in range(6)]
    requests += [completion("Costs and outlook. " * (40 + i)) for i in range(6)]
    sequential = [await prompt_tokenizer.render_and_tokenize(r, qwen) for r in requests]
    concurrent = await asyncio.gather(*(prompt_tokenizer.render_and_tokenize(r, qwen) for r in requests * 3))
    assert list(concurrent) == sequential * 3
