"""Inline SVG pieces for the status page: small, self-contained, labelled (``aria-label``) and paired with the
number in text, so the page reads the same without images, styles or JavaScript."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

WIDTH = 140
HEIGHT = 12
COLORS = ("#3b73b9", "#e08a1e", "#4a9a4a", "#b94a48", "#7a5ab9", "#888888")


def bar(share: float | None, label: str, color: str = COLORS[0], width: int = WIDTH) -> str:
    """A horizontal bar filled to ``share`` (0..1, clamped); an empty outline when unknown."""
    filled = 0.0 if share is None else min(max(share, 0.0), 1.0) * width
    return (
        f'<svg class="bar" width="{width}" height="{HEIGHT}" role="img" aria-label="{escape(label)}">'
        f'<rect width="{width}" height="{HEIGHT}" fill="#eee" stroke="#bbb"/>'
        f'<rect width="{filled:.1f}" height="{HEIGHT}" fill="{color}"/></svg>'
    )


def pair(first: float | None, second: float | None, label: str, width: int = WIDTH) -> str:
    """Two thin bars, one above the other (e.g. predicted above actual), on one 0..1 scale."""
    half = HEIGHT // 2 + 1
    rows = []
    for i, (share, color) in enumerate(((first, COLORS[0]), (second, COLORS[1]))):
        filled = 0.0 if share is None else min(max(share, 0.0), 1.0) * width
        rows.append(f'<rect y="{i * half}" width="{filled:.1f}" height="{half - 1}" fill="{color}"/>')
    return (
        f'<svg class="pair" width="{width}" height="{2 * half}" role="img" aria-label="{escape(label)}">'
        f'<rect width="{width}" height="{2 * half}" fill="#eee" stroke="#bbb"/>{"".join(rows)}</svg>'
    )


def stacked(parts: Sequence[tuple[str, float]], label: str, width: int = 4 * WIDTH) -> str:
    """One bar split into named parts by their share of the total (e.g. decisions by reason), with a legend."""
    total = sum(v for _, v in parts) or 1.0
    x, rects, legend = 0.0, [], []
    for i, (name, value) in enumerate(parts):
        w = value / total * width
        color = COLORS[i % len(COLORS)]
        rects.append(f'<rect x="{x:.1f}" width="{w:.1f}" height="{2 * HEIGHT}" fill="{color}">'
                     f"<title>{escape(name)}: {value:g}</title></rect>")  # fmt: skip
        legend.append(f'<span class="key" style="border-color:{color}">{escape(name)} {value:g}</span>')
        x += w
    return (
        f'<svg class="stacked" width="{width}" height="{2 * HEIGHT}" role="img" aria-label="{escape(label)}">'
        f'<rect width="{width}" height="{2 * HEIGHT}" fill="#eee"/>{"".join(rects)}</svg>'
        f'<div class="legend">{" ".join(legend)}</div>'
    )
