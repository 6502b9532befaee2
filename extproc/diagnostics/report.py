"""Prefix-stability reports: a text report (``extproc diagnose``), an SVG plot of per-block repeat rates by
token offset, and ``render_section``, the HTML fragment (plain HTML + inline SVG, no JS) the status page embeds.

Pure functions of ``StreamReport`` s. They never contain prompt text: only model and tenant-class names
(escaped), offsets, message indexes and roles, and rates.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from extproc.diagnostics.prefix_stability import Span, StreamReport

_W, _H, _PAD = 640, 220, 40  # one plot panel: width, height, margin (px)
CACHED_COLOR, REPEATED_COLOR, SPAN_COLOR = "#1f77b4", "#ff7f0e", "#d62728"  # the PNG plot uses them too
ADVICE = (
    "move the varying value (timestamp, request id, user name) out of the prompt's beginning: after the stable "
    "instructions, into the last message, or drop it; then this stream's prefixes are cached again"
)


def _where(span: Span) -> str:
    message = f", message {span.message.index} ({span.message.role})" if span.message else ""
    return f"token {span.offset_tokens} (block {{block}}){message}, about {span.length_tokens} tokens long"


def text_report(reports: Sequence[StreamReport]) -> str:
    """One paragraph per stream (model, tenant class); says plainly when no varying span was found."""
    if not reports:
        return "prefix stability: no requests diagnosed\n"
    lines = []
    for r in reports:
        lines.append(f"model {r.key.model}, tenant {r.key.tenant}: {r.diagnosed} requests diagnosed")
        cached = f"{100 * r.cached_share:.0f}% of prompt blocks"
        if r.span is None:
            lines.append(f"  no varying span: prefixes repeat as far as their content does (prefix hits {cached})")
            continue
        where = _where(r.span).format(block=r.span.offset_tokens // r.block_size)
        spread = f"; offsets {r.span_offsets[0]}..{r.span_offsets[1]}" if r.span_offsets else ""
        lines += [
            f"  varying span in {r.window_varying} of the last {r.window} requests: at {where}{spread}",
            f"  prefix hits: {cached} now, {100 * (r.cached_share + r.lost_share):.0f}% were the span stable "
            f"({100 * r.lost_share:.0f} points lost)",
            f"  what to do: {ADVICE}",
        ]
    return "\n".join(lines) + "\n"


def _points(rates: Sequence[tuple[int, float]], max_x: int) -> str:
    return " ".join(f"{_PAD + (_W - 2 * _PAD) * x / max_x:.1f},{_H - _PAD - (_H - 2 * _PAD) * y:.1f}" for x, y in rates)


def svg_panel(r: StreamReport, *, top: int = 0) -> str:
    """One stream's plot as an SVG ``<g>``: share of requests whose block at each token offset is a prefix hit
    (chained hashes) and whose content there repeats a recent request (re-cut after the span)."""
    blocks = [b for b, n in enumerate(r.seen) if n]
    title = escape(f"{r.key.model} / {r.key.tenant}")
    parts = [f'<g transform="translate(0,{top})">', f'<text x="{_PAD}" y="16" font-size="12">{title}</text>']
    if not blocks:
        return "".join([*parts, f'<text x="{_PAD}" y="{_H // 2}" font-size="12">no data</text></g>'])
    max_x = max((blocks[-1] + 1) * r.block_size, 1)
    cached = [(b * r.block_size, r.cached[b] / r.seen[b]) for b in blocks]
    repeated = [(b * r.block_size, r.repeated[b] / r.seen[b]) for b in blocks]
    x0, x1, y0, y1 = _PAD, _W - _PAD, _PAD, _H - _PAD
    parts += [
        f'<line x1="{x0}" y1="{y1}" x2="{x1}" y2="{y1}" stroke="black"/>',
        f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}" stroke="black"/>',
        f'<text x="{x0 - 4}" y="{y0 + 4}" font-size="10" text-anchor="end">100%</text>',
        f'<text x="{x0 - 4}" y="{y1}" font-size="10" text-anchor="end">0</text>',
        f'<text x="{x1}" y="{y1 + 14}" font-size="10" text-anchor="end">{max_x} tokens</text>',
        f'<text x="{x0}" y="{y1 + 14}" font-size="10">0</text>',
        f'<polyline fill="none" stroke="{REPEATED_COLOR}" stroke-width="2" points="{_points(repeated, max_x)}"/>',
        f'<polyline fill="none" stroke="{CACHED_COLOR}" stroke-width="2" points="{_points(cached, max_x)}"/>',
        f'<text x="{x1}" y="{y0 - 16}" font-size="10" text-anchor="end" fill="{REPEATED_COLOR}">content repeats</text>',
        f'<text x="{x1}" y="{y0 - 4}" font-size="10" text-anchor="end" fill="{CACHED_COLOR}">prefix cache hit</text>',
    ]
    if r.span is not None:
        x = x0 + (x1 - x0) * r.span.offset_tokens / max_x
        parts += [
            f'<line x1="{x:.1f}" y1="{y0}" x2="{x:.1f}" y2="{y1}" stroke="{SPAN_COLOR}" stroke-dasharray="4 3"/>',
            f'<text x="{x + 3:.1f}" y="{y0 + 12}" font-size="10" fill="{SPAN_COLOR}">varying span '
            f"@{r.span.offset_tokens}</text>",
        ]
    return "".join([*parts, "</g>"])


def svg_plot(reports: Sequence[StreamReport]) -> str:
    """A standalone SVG document: one panel per stream, stacked."""
    height = max(len(reports), 1) * _H
    panels = "".join(svg_panel(r, top=i * _H) for i, r in enumerate(reports))
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{height}" '
        f'viewBox="0 0 {_W} {height}" font-family="sans-serif">{panels}</svg>\n'
    )


def render_section(reports: Sequence[StreamReport]) -> str:
    """The status page's fragment: a ``<section>`` with a table row per stream and a plot per reported one."""
    rows = []
    for r in reports:
        where = "none"
        if r.span is not None:
            where = escape(_where(r.span).format(block=r.span.offset_tokens // r.block_size))
        rows.append(
            f"<tr><td>{escape(r.key.model)}</td><td>{escape(r.key.tenant)}</td><td>{r.diagnosed}</td>"
            f"<td>{r.window_varying}/{r.window}</td><td>{where}</td><td>{100 * r.cached_share:.0f}%</td>"
            f"<td>{100 * r.lost_share:.0f}%</td></tr>"
        )
    reported = [r for r in reports if r.span is not None]
    plot = svg_plot(reported) if reported else ""
    advice = f"<p>What to do: {escape(ADVICE)}.</p>" if reported else ""
    return (
        '<section id="prefix-stability"><h2>Prefix stability</h2>'
        "<table><tr><th>model</th><th>tenant</th><th>diagnosed</th><th>with a varying span</th>"
        "<th>where</th><th>prefix hits</th><th>lost to the span</th></tr>"
        f"{''.join(rows) or '<tr><td colspan=7>no requests diagnosed yet</td></tr>'}</table>"
        f"{advice}{plot}</section>"
    )
