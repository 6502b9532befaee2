"""``render(view, sections)``: the ``/status`` page, plain HTML and inline SVG.

No build step, no external requests (styles inline, no fonts, no scripts), readable without JavaScript; it
reloads itself every ``refresh_s`` with a ``<meta http-equiv="refresh">``. Pure: a ``FleetView`` in, a string
out, so it is unit-tested without a server.

Sections are a list of renderers, ``Section = Callable[[FleetView], str]``, each returning one
``<section id=...>`` (or "" to leave itself out). ``DEFAULT_SECTIONS`` is the fleet; a later report (the
prefix-stability report) is one more renderer the composition root appends, reading its own data through a
closure: ``render(view, [*DEFAULT_SECTIONS, stability_section])``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from html import escape

from extproc.status.svg import bar, pair, stacked
from extproc.status.view import PHASES, EndpointRow, FleetView
from extproc.types import EndpointId

Section = Callable[[FleetView], str]

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.4em;margin:0 0 .2em}h2{font-size:1.1em;margin:1.4em 0 .4em;border-bottom:1px solid #ccc}
table{border-collapse:collapse}th,td{padding:2px 8px;text-align:right;vertical-align:middle}
th{background:#f3f3f3}td.l,th.l{text-align:left}tr:nth-child(even) td{background:#fafafa}
.bad{color:#b94a48;font-weight:bold}.ok{color:#4a9a4a}.muted{color:#888}
.legend{margin:.3em 0}.key{border-left:12px solid;padding:0 8px 0 4px}
p.note{color:#555;max-width:60em}#decisions td:last-child{text-align:left}
"""


def render(view: FleetView, sections: Sequence[Section] | None = None, *, refresh_s: int = 5) -> str:
    """The whole page: ``sections`` (default ``DEFAULT_SECTIONS``) in order, under one header."""
    chosen = DEFAULT_SECTIONS if sections is None else sections
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(view.at_s))
    body = "\n".join(part for part in (s(view) for s in chosen) if part)
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="refresh" content="{refresh_s}"><title>router status</title>'
        f"<style>{_STYLE}</style></head><body>"
        f'<header><h1>What the scheduler sees</h1><p class="muted">{stamp}; reloads every {refresh_s} s; '
        "rates and windowed ratios cover the last 60 s of views and scrapes</p></header>\n"
        f"{body}\n</body></html>\n"
    )


def _pct(share: float | None) -> str:
    return "—" if share is None else f"{share * 100:.1f}%"


def _num(value: float | None, digits: int = 0) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def _ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1000:.1f} ms"


def _table(head: Iterable[str], rows: Iterable[Iterable[str]], left: int = 1) -> str:
    """``left``: how many leading columns are text (left-aligned). Cells are HTML already."""
    ths = "".join(f"<th{' class=l' if i < left else ''}>{h}</th>" for i, h in enumerate(head))
    trs = "".join(
        "<tr>" + "".join(f"<td{' class=l' if i < left else ''}>{c}</td>" for i, c in enumerate(r)) + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{ths}</tr></thead><tbody>{trs}</tbody></table>"


def _section(sid: str, title: str, content: str, note: str = "") -> str:
    p = f'<p class="note">{note}</p>' if note else ""
    return f'<section id="{sid}"><h2>{escape(title)}</h2>{p}{content}</section>'


def fleet_summary(view: FleetView) -> str:
    eps = view.endpoints
    healthy = sum(1 for e in eps if e.healthy)
    precise = sum(1 for e in eps if e.stream and e.stream.precise)
    reasons = sorted(view.decisions_by_reason.items(), key=lambda kv: -kv[1])
    total = sum(view.decisions_by_reason.values())
    blocks = ", ".join(f"{escape(k)} {v:,}" for k, v in view.index_blocks.items()) or "—"
    head = ("endpoints", "healthy", "routed by events", "decisions", "index blocks", "ceiling queue",
            "ceiling skipped")  # fmt: skip
    row = (str(len(eps)), str(healthy), str(precise), f"{total:,}", blocks, str(view.ceiling_queued),
           str(view.ceiling_dropped))  # fmt: skip
    facts = _table(head, [row], left=0)
    chart = stacked(reasons, "decisions by reason") if reasons else '<p class="muted">no decisions yet</p>'
    return _section("fleet", "Fleet at a glance", facts + "<h3>Decisions by reason</h3>" + chart)


def _phase_cells(e: EndpointRow) -> list[str]:
    return [_ms(e.phase_mean(p)) if p in e.phases else '<span class="muted">n/a</span>' for p in PHASES]


def endpoints(view: FleetView) -> str:
    rows = []
    for e in view.endpoints:
        health = '<span class="ok">up</span>' if e.healthy else '<span class="bad">down</span>'
        load = "" if e.load_known else ' <span class="bad">(stale)</span>'
        rows.append([
            escape(e.id), health + load, str(e.running), str(e.waiting), _num(e.queued_prefill_tokens),
            f"{bar(e.kv_usage, 'KV use')} {_pct(e.kv_usage)}",
            f"{bar(e.occupancy, 'cache occupancy', '#4a9a4a')} {_pct(e.occupancy)}",
            f"{e.routed.requests:,}", *_phase_cells(e),
        ])  # fmt: skip
    head = ("endpoint", "state", "running", "waiting", "queued prefill tok", "KV use", "cache occupancy",
            "routed", *(f"{p} (mean)" for p in PHASES))  # fmt: skip
    note = ("Load as last scraped; queued prefill is the router's own estimate. Occupancy: index entries "
            "(from events if followed, else the router's guesses) over the engine's KV blocks. Phase means "
            "come from the engines' histograms: over the last 60 s, or since the engine started when no request "
            "finished that phase meanwhile (n/a: the engine exports none).")  # fmt: skip
    return _section("endpoints", "Endpoints", _table(head, rows, left=2), note)


def hit_rates(view: FleetView) -> str:
    rows = []
    for e in view.endpoints:
        predicted = e.predicted_hit_ratio if e.predicted_hit_ratio is not None else e.predicted_hit_ratio_total
        engine = e.engine_hit_ratio if e.engine_hit_ratio is not None else e.engine_hit_ratio_total
        flag = e.prediction_ratio is not None and not 0.8 <= e.prediction_ratio <= 1.25
        ratio = _num(e.prediction_ratio, 2)
        rows.append([
            escape(e.id), pair(predicted, engine, f"predicted {_pct(predicted)}, engine {_pct(engine)}"),
            _pct(e.predicted_hit_ratio), _pct(e.engine_hit_ratio),
            f'<span class="bad">{ratio}</span>' if flag else ratio,
            _pct(e.predicted_hit_ratio_total), _pct(e.engine_hit_ratio_total),
            f"{e.routed.predicted_cached_tokens:,}", _num(e.engine_hit_tokens),
        ])  # fmt: skip
    head = (
        "endpoint",
        "predicted / actual",
        "predicted (60 s)",
        "engine (60 s)",
        "actual ÷ predicted (60 s)",
        "predicted (since start)",
        "engine (since its start)",
        "predicted cached tok",
        "engine cached tok",
    )
    note = ("Blue: what the router predicted on its picks; orange: what the engine reports (all its traffic, other "
            "routers' too); the bars show the last 60 s, or since start when nothing was routed meanwhile. "
            "Actual ÷ predicted far from 1 means the index is wrong (docs/observability.md).")  # fmt: skip
    return _section("hit-rates", "Hit rates: predicted vs actual", _table(head, rows, left=2), note)


def streams(view: FleetView) -> str:
    rows = []
    for e in view.endpoints:
        s = e.stream
        if s is None:
            rows.append([escape(e.id), '<span class="muted">not followed (routed by the router\'s guesses)</span>',
                         *[""] * 6])  # fmt: skip
            continue
        state = "precise" if s.precise else "cold" if s.cold else "untrusted" if not s.trusted else "not precise"
        cls = "ok" if s.precise else "bad"
        conn = "connected" if s.connected else '<span class="bad">disconnected</span>'
        rows.append([
            escape(e.id), f'<span class="{cls}">{state}</span>, {conn}{"" if s.writer else ", reader"}',
            _num(s.last_seq), "—" if s.event_age_s is None else f"{s.event_age_s:.1f} s",
            _num(s.stored_per_s, 1), _num(s.removed_per_s, 1), f"{s.blocks_stored:,}", f"{s.blocks_removed:,}",
        ])  # fmt: skip
    head = ("endpoint", "stream", "last seq", "last event", "stored/s", "removed/s", "stored", "removed")
    return _section("streams", "KV-event streams", _table(head, rows, left=2))


def models(view: FleetView) -> str:
    rows = []
    for m in view.models:
        ceiling = None if m.ceiling is None else m.ceiling.share
        label = f"predicted {_pct(m.predicted_hit_ratio)}, ceiling {_pct(ceiling)}"
        of = None if not ceiling or m.predicted_hit_ratio is None else m.predicted_hit_ratio / ceiling
        rows.append([escape(m.model), escape(m.tenant_class), f"{m.routed.requests:,}",
                     pair(m.predicted_hit_ratio, ceiling, label), _pct(m.predicted_hit_ratio), _pct(ceiling),
                     _pct(of)])  # fmt: skip
    head = ("model", "tenant class", "requests", "predicted / ceiling", "predicted hit rate", "ceiling",
            "of ceiling")  # fmt: skip
    note = (
        "Since start. Ceiling: the share an infinite prefix cache would hit on the same requests in order "
        "(an estimate; it under-counts when requests were skipped)."
    )
    return _section("models", "Models and tenant classes", _table(head, rows, left=2), note)


def _top(values: Mapping[EndpointId, float], lower_better: bool) -> str:
    ordered = sorted(values.items(), key=lambda kv: kv[1], reverse=not lower_better)[:3]
    return ", ".join(f"{escape(k)} {v:.3g}" for k, v in ordered)


def decisions(view: FleetView) -> str:
    rows = []
    for d in view.recent:
        why = (f"TTFT est. s: {_top(d.estimates_s, True)}" if d.estimates_s
               else f"scores: {_top(d.scores, False)}" if d.scores else "")  # fmt: skip
        rows.append([
            time.strftime("%H:%M:%S", time.gmtime(d.at_s)), escape(d.request_id[:16]), escape(d.model),
            escape(d.tenant_class), escape(d.endpoints[0]), escape(", ".join(d.endpoints[1:])), escape(d.reason),
            f"{d.prompt_tokens:,}", f"{d.cached_tokens:,}", why,
        ])  # fmt: skip
    head = ("time", "request", "model", "tenant class", "picked", "fallbacks", "reason", "prompt tok",
            "predicted cached", "why (best three)")  # fmt: skip
    content = _table(head, rows, left=7) if rows else '<p class="muted">no decisions yet</p>'
    return _section("decisions", f"Recent decisions (last {len(view.recent)})", content)


DEFAULT_SECTIONS: tuple[Section, ...] = (fleet_summary, endpoints, hit_rates, streams, models, decisions)
