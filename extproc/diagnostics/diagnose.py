"""``extproc diagnose``: prefix stability over a sample of requests or a trace, offline; a report and a plot.

Input: JSONL, one request per line, in any of three shapes:
- an OpenAI body (``{"model": ..., "messages": [...]}`` or ``{"model": ..., "prompt": ...}``);
- ``{"body": {...}, "tenant": "<class>"}`` (a body with the tenant class it came from);
- a trace row with ``hash_ids`` (Mooncake's format: one id per block of ``--trace-block-tokens``).
Bodies are rendered and tokenized as the picker does (``extproc.prompt``, tokenizers from tokenizer_cache/,
offline), then diagnosed in file order, as if they arrived in that order. The prompt text is never printed
unless ``--log-prompts`` (the command's ``logging.log_prompts``).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from extproc.config import DiagnosticsConfig
from extproc.diagnostics.fingerprints import BlockIdView, Fingerprinter, PromptView
from extproc.diagnostics.live import GRANULE_TOKENS, settings_from_config
from extproc.diagnostics.prefix_stability import MessageRef, PrefixStability, StreamKey, StreamReport
from extproc.diagnostics.report import CACHED_COLOR, REPEATED_COLOR, SPAN_COLOR, svg_plot, text_report
from extproc.prompt.models import BaseModel
from extproc.prompt.openai import ParsedRequest, RequestKind, parse_request
from extproc.prompt.render import render_and_tokenize_sync, render_chat_text
from extproc.prompt.tokenizers import LoadedTokenizer, TokenizerRegistry


@dataclass(frozen=True, slots=True)
class _Request:
    key: StreamKey
    view: PromptView
    block_size: int
    locate: Callable[[int], MessageRef | None] | None
    text_of: Callable[[int, int], str] | None  # (offset, length) -> that span's text; only with --log-prompts


def run(args: argparse.Namespace) -> int:
    """The command: read, diagnose in order, print the report, write the plot. Exit 0; 2 on unreadable input."""
    config = DiagnosticsConfig(window_requests=1 << 30)  # the report covers the whole file
    detector = PrefixStability(settings_from_config(config))
    reader = _Reader(args, Fingerprinter(GRANULE_TOKENS, key=0))
    examples: dict[StreamKey, str] = {}
    skipped = 0
    for n, row in enumerate(_rows(Path(args.input))):
        if args.limit and n >= args.limit:
            break
        request = reader.request(row)
        if request is None:
            skipped += 1
            continue
        outcome = detector.observe(request.key, request.view, request.block_size, request.locate)
        if outcome.span and request.text_of and request.key not in examples:
            examples[request.key] = request.text_of(outcome.span.offset_tokens, outcome.span.length_tokens)
    reports = detector.reports()
    print(text_report(reports), end="")
    for key, text in examples.items():
        print(f"example span ({key.model}, {key.tenant}): {text!r}")
    if skipped:
        print(f"({skipped} rows could not be tokenized and were skipped)")
    if args.plot:
        _write_plot(Path(args.plot), reports)
        print(f"plot: {args.plot}")
    return 0


def _write_plot(path: Path, reports: Sequence[StreamReport]) -> None:
    """SVG (our own drawing, as on the status page); ``.png`` with matplotlib, where it is installed."""
    if path.suffix.lower() != ".png":
        path.write_text(svg_plot(reports))
        return
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ValueError("a .png plot needs matplotlib (pip install matplotlib), or write .svg") from exc
    fig, axes = plt.subplots(max(len(reports), 1), 1, figsize=(8, 2.6 * max(len(reports), 1)), squeeze=False)
    for ax, r in zip(axes[:, 0], reports, strict=False):
        blocks = [b for b, n in enumerate(r.seen) if n]
        x = [b * r.block_size for b in blocks]
        ax.plot(x, [r.repeated[b] / r.seen[b] for b in blocks], color=REPEATED_COLOR, label="content repeats")
        ax.plot(x, [r.cached[b] / r.seen[b] for b in blocks], color=CACHED_COLOR, label="prefix cache hit")
        if r.span is not None:
            ax.axvline(
                r.span.offset_tokens, color=SPAN_COLOR, linestyle="--", label=f"varying span @{r.span.offset_tokens}"
            )
        ax.set(
            title=f"{r.key.model} / {r.key.tenant}", xlabel="token offset", ylabel="share of requests", ylim=(0, 1.05)
        )
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _rows(path: Path) -> Iterator[Mapping[str, Any]]:
    with path.open() as f:
        for i, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{i}: not JSON: {exc}") from exc


class _Reader:
    """Rows → requests: bodies tokenized with the picker's own render path, trace rows as block ids."""

    def __init__(self, args: argparse.Namespace, fingerprinter: Fingerprinter) -> None:
        self._args = args
        self._fingerprinter = fingerprinter
        self._tokenizers = TokenizerRegistry(Path(args.tokenizer_cache))

    def request(self, row: Mapping[str, Any]) -> _Request | None:
        if "hash_ids" in row:
            block = self._args.trace_block_tokens
            key = StreamKey(self._args.model or "trace", str(row.get("tenant", "default")))
            return _Request(key, BlockIdView(row["hash_ids"], block), block, None, None)
        body = row.get("body", row)
        model = self._args.model or str(body.get("model", ""))
        kind = RequestKind.CHAT if "messages" in body else RequestKind.COMPLETION
        try:
            parsed = parse_request(json.dumps(body).encode(), "application/json", kind)
            loaded = self._tokenizers.get(BaseModel(model))
            tokens = render_and_tokenize_sync(loaded.tokenizer, loaded.info, parsed, loaded.encoder)
        except Exception:  # a bad row, an unknown model or template: skipped and counted, never fatal
            return None
        key = StreamKey(str(body.get("model", model)), str(row.get("tenant", "default")))
        locate = _locator(loaded, parsed) if parsed.messages else None
        text_of = _text_of(loaded, tokens) if self._args.log_prompts else None
        return _Request(key, self._fingerprinter.view(tokens), self._args.block_size, locate, text_of)


def _locator(loaded: LoadedTokenizer, parsed: ParsedRequest) -> Callable[[int], MessageRef | None]:
    """Token offset → message, by rendering the conversation's prefixes (only when a span is found)."""

    def locate(offset: int) -> MessageRef | None:
        starts = [0]
        try:
            for i in range(1, len(parsed.messages)):
                head = replace(parsed, messages=parsed.messages[:i], add_generation_prompt=False,
                               continue_final_message=False)  # fmt: skip
                text = render_chat_text(loaded.tokenizer, loaded.info, head)
                starts.append(len(loaded.encoder.encode(text, add_special_tokens=parsed.add_special_tokens)))
        except Exception:  # a template that refuses a partial conversation: unknown
            return None
        index = max(i for i, s in enumerate(starts) if s <= offset)
        return MessageRef(index, str(parsed.messages[index].get("role", "?")))

    return locate


def _text_of(loaded: LoadedTokenizer, tokens: Sequence[int]) -> Callable[[int, int], str]:
    def text_of(offset: int, length: int) -> str:
        decode = getattr(loaded.tokenizer, "decode", None)
        return str(decode(list(tokens[offset : offset + length]))) if decode else "?"

    return text_of
