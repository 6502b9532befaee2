"""The prefix-stability detector as a table: workloads of token ids built for it, and what it must report."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from extproc.config import DiagnosticsConfig
from extproc.diagnostics.fingerprints import BlockIdView, Fingerprinter
from extproc.diagnostics.live import GRANULE_TOKENS, settings_from_config
from extproc.diagnostics.prefix_stability import MessageRef, PrefixStability, StreamKey

BLOCK = 16
SYSTEM_AT, USER_AT = 0, 400  # token offsets where the two messages start
STAMP_AT = 9  # the varying span's first token (inside the system message)
KEY = StreamKey("m", "default")
Workload = Callable[[random.Random], list[list[int]]]


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(100, 150000) for _ in range(n)]


def _locate(offset: int) -> MessageRef:
    return MessageRef(1, "user") if offset >= USER_AT else MessageRef(0, "system")


def timestamp_at_top(rng: random.Random, *, variable_length: bool = False) -> list[list[int]]:
    """A system prompt with a per-request timestamp at token 9, then one of a few user questions."""
    head, system = _tokens(rng, STAMP_AT), _tokens(rng, USER_AT - STAMP_AT - 8)
    questions = [_tokens(rng, 60) for _ in range(3)]
    out = []
    for i in range(40):
        stamp = _tokens(rng, 8 + (i % 3 if variable_length else 0))
        out.append(head + stamp + system + questions[i % 3])
    return out


def stable(rng: random.Random) -> list[list[int]]:
    prompt = _tokens(rng, 500)
    return [prompt for _ in range(30)]


def unique(rng: random.Random) -> list[list[int]]:
    return [_tokens(rng, 500) for _ in range(30)]


def shared_system_unique_user(rng: random.Random) -> list[list[int]]:
    system = _tokens(rng, USER_AT)
    return [system + _tokens(rng, 200) for _ in range(30)]


def growing_agent_context(rng: random.Random) -> list[list[int]]:
    """Two interleaved agent loops: each turn is the previous prompt plus a tool result and a new turn."""
    loops = [_tokens(rng, 300), _tokens(rng, 300)]
    out = []
    for i in range(30):
        loops[i % 2] = loops[i % 2] + _tokens(rng, 50)
        out.append(list(loops[i % 2]))
    return out


def _run(workload: Workload, config: DiagnosticsConfig | None = None) -> PrefixStability:
    detector = PrefixStability(settings_from_config(config or DiagnosticsConfig()))
    fingerprinter = Fingerprinter(GRANULE_TOKENS, key=7)
    for prompt in workload(random.Random(1)):
        detector.observe(KEY, fingerprinter.view(prompt), BLOCK, _locate)
    return detector


def stamped_minority(rng: random.Random) -> list[list[int]]:
    """One client in five stamps its system prompt; the others send a stable prompt of their own."""
    other = _tokens(rng, 300)
    stamped = iter(timestamp_at_top(rng))
    return [next(stamped) if i % 5 == 0 else other for i in range(150)]


@pytest.mark.parametrize(
    "workload",
    [timestamp_at_top, lambda rng: timestamp_at_top(rng, variable_length=True)],
    ids=["timestamp-at-top", "timestamp-of-varying-length"],
)
def test_a_timestamp_at_the_top_of_the_system_prompt_is_found(workload: Workload) -> None:
    (report,) = _run(workload).reports()
    assert report.span is not None and report.span.message == MessageRef(0, "system")
    assert STAMP_AT - GRANULE_TOKENS < report.span.offset_tokens <= STAMP_AT
    assert report.span.length_tokens <= 8 + 2 + 2 * GRANULE_TOKENS
    assert report.window_varying >= 38  # all but the first (nothing to compare with) and chance
    assert report.cached_share < 0.01  # nothing past block 0 is ever a prefix hit ...
    assert report.lost_share > 0.8  # ... while the system prompt (24 of 28 blocks) repeats
    assert report.lost_blocks >= 24 * report.varying  # at least the system prompt's blocks, per span found
    assert report.repeated[5] > 0.9 * report.seen[5] > 0 and report.cached[5] == 0


@pytest.mark.parametrize(
    "workload",
    [stable, unique, shared_system_unique_user, growing_agent_context],
    ids=["stable", "unique", "shared-system-prompt-unique-users", "growing-agent-context"],
)
def test_workloads_without_a_varying_span_report_nothing(workload: Workload) -> None:
    (report,) = _run(workload).reports()
    assert report.span is None and report.varying == 0 and report.lost_blocks == 0
    assert report.diagnosed == 30


def test_a_span_in_a_fifth_of_a_streams_requests_is_reported() -> None:
    (report,) = _run(stamped_minority).reports()
    assert report.span is not None and report.span.message == MessageRef(0, "system")
    assert report.window_varying == 29 and 0.1 < report.lost_share < 0.5


def test_a_span_longer_than_max_span_tokens_is_not_reported() -> None:
    config = DiagnosticsConfig(max_span_tokens=4)
    (report,) = _run(timestamp_at_top, config).reports()
    assert report.span is None and report.lost_blocks == 0


def test_stored_fingerprints_stay_within_the_memory_bound() -> None:
    config = DiagnosticsConfig(memory_mib=1, recent_requests=1000)
    detector = PrefixStability(settings_from_config(config))
    fingerprinter = Fingerprinter(GRANULE_TOKENS, key=7)
    rng = random.Random(2)
    prompt = _tokens(rng, 40000)  # 80 KB of fingerprints each
    for i in range(20):
        detector.observe(StreamKey("m", str(i % 3)), fingerprinter.view(prompt), BLOCK)
    assert 0 < detector.stored_bytes <= 1 << 20


def test_a_mooncake_style_trace_of_chained_block_ids_reports_nothing() -> None:
    """Trace ids are per prefix, not per content: a divergence never re-aligns."""
    detector = PrefixStability(settings_from_config(DiagnosticsConfig()))
    rows = [[0, 1, 2, 3], [0, 4, 5, 6, 7], [0, 1, 2, 8, 9], [0, 10, 11]] * 5
    for ids in rows:
        detector.observe(KEY, BlockIdView(ids, 512), 512)
    (report,) = detector.reports()
    assert report.span is None and report.diagnosed == 20 and report.cached_share > 0


def test_trace_ids_per_content_show_a_varying_first_block() -> None:
    """If a trace's ids were per block content, a varying first block followed by repeats is a span."""
    detector = PrefixStability(settings_from_config(DiagnosticsConfig(max_span_tokens=512)))
    for i in range(10):
        detector.observe(KEY, BlockIdView([1000 + i, 1, 2, 3, 4], 512), 512)
    (report,) = detector.reports()
    assert report.span is not None and report.span.offset_tokens == 0 and report.span.message is None
