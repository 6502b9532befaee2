"""``report.md`` and PNG plots from ``results.json``; the issue's goals checked on the numbers of one run.

Goals (all from one run, same fleet, side by side):

* ``tenants``, at the highest rate that round robin completes (every request succeeded): precise TTFT p90
  <= 0.1x round robin and <= 0.5x approximate; output tokens/s >= 1.5x round robin; cached share >= 90% of
  the workload's ceiling;
* ``unique``: precise and approximate within 5% of round robin (TTFT p90 at most 1.05x, output tokens/s at
  least 0.95x);
* every prefix-heavy workload: precise TTFT p90 below the best (lowest) of the peer routers' policies, at the
  highest rate where that peer completed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.suite.policies import OURS, PEERS, POLICIES

COLUMNS = (
    ("rate", "offered_rate_rps", "{:g}"),
    ("ok", "success_rate", "{:.2f}"),
    ("TTFT p50 s", "ttft_p50_s", "{:.3f}"),
    ("TTFT p90 s", "ttft_p90_s", "{:.3f}"),
    ("TTFT p99 s", "ttft_p99_s", "{:.3f}"),
    ("E2E p50 s", "e2e_p50_s", "{:.2f}"),
    ("E2E p90 s", "e2e_p90_s", "{:.2f}"),
    ("out tok/s", "output_tok_s", "{:.0f}"),
    ("cached", "cached_token_share", "{:.2f}"),
    ("of ceiling", "cached_share_of_ceiling", "{:.2f}"),
    ("spread cv", "load_spread_cv", "{:.2f}"),
    ("router CPU ms/req", "router_cpu_ms_per_req", "{:.1f}"),
)


def _fmt(fmt: str, value: Any) -> str:
    return "–" if value is None else fmt.format(value)


def _cells(doc: dict[str, Any], workload: str, policy: str) -> list[dict[str, Any]]:
    p = doc["workloads"].get(workload, {}).get("policies", {}).get(policy)
    return p["cells"] if p and p.get("status") == "ok" else []


def _at(cells: list[dict[str, Any]], rate: float) -> dict[str, Any] | None:
    return next((c for c in cells if c["offered_rate_rps"] == rate), None)


def _completed(cell: dict[str, Any] | None) -> bool:
    return cell is not None and cell["success_rate"] >= 1.0


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def goals(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Each goal: ``name``, ``met`` (True/False/None = not measurable), ``detail``."""
    out: list[dict[str, Any]] = []
    if "tenants" in doc["workloads"]:
        out += _tenant_goals(doc)
    if "unique" in doc["workloads"]:
        out += _unique_goals(doc)
    for name, w in doc["workloads"].items():
        if w.get("prefix_heavy"):
            out.append(_peer_goal(doc, name))
    return out


def _tenant_goals(doc: dict[str, Any]) -> list[dict[str, Any]]:
    rr, pr, ap = (_cells(doc, "tenants", p) for p in ("round_robin", "precise", "approximate"))
    done = [c["offered_rate_rps"] for c in rr if _completed(c)]
    if not done or not pr:
        missing = [name for name, cells in (("round_robin", rr), ("precise", pr)) if not cells]
        why = f"no results from {', '.join(missing)}" if missing else "round robin did not complete any rate"
        return [{"name": "tenants goals", "met": None, "detail": why}]
    rate = max(done)
    r, p, a = _at(rr, rate), _at(pr, rate), _at(ap, rate)
    if p is None:
        return [{"name": "tenants goals", "met": None, "detail": f"precise has no cell at {rate:g} rps"}]
    assert r is not None
    where = f"tenants at {rate:g} rps (highest rate round robin completes)"
    others = [c["offered_rate_rps"] for c in pr if c["offered_rate_rps"] != rate and _at(rr, c["offered_rate_rps"])]
    res = []
    x = _ratio(p["ttft_p90_s"], r["ttft_p90_s"])
    res.append({"name": "precise TTFT p90 <= 0.1x round robin", "met": x is not None and x <= 0.1,
                "detail": f"{where}: {_fmt('{:.3f}', p['ttft_p90_s'])} s vs {_fmt('{:.3f}', r['ttft_p90_s'])} s "
                          f"= {_fmt('{:.3f}', x)}x"})  # fmt: skip
    if a is not None:
        x = _ratio(p["ttft_p90_s"], a["ttft_p90_s"])
        res.append({"name": "precise TTFT p90 <= 0.5x approximate", "met": x is not None and x <= 0.5,
                    "detail": f"{where}: {_fmt('{:.3f}', p['ttft_p90_s'])} s vs "
                              f"{_fmt('{:.3f}', a['ttft_p90_s'])} s = {_fmt('{:.2f}', x)}x"})  # fmt: skip
    x = _ratio(p["output_tok_s"], r["output_tok_s"])
    res.append(
        {
            "name": "precise output tok/s >= 1.5x round robin",
            "met": x is not None and x >= 1.5,
            "detail": f"{where}: {p['output_tok_s']:.0f} vs {r['output_tok_s']:.0f} = {_fmt('{:.2f}', x)}x",
        }
    )
    x = p["cached_share_of_ceiling"]
    res.append({"name": "precise cached share >= 90% of ceiling", "met": x is not None and x >= 0.9,
                "detail": f"{where}: {p['cached_token_share']:.3f} of ceiling {p['ceiling_cached_share']:.3f} "
                          f"= {_fmt('{:.1%}', x)}"})  # fmt: skip
    for r_ in others:  # the same ratios at the other rates, for context
        pc, rc, ac = _at(pr, r_), _at(rr, r_), _at(ap, r_)
        assert pc is not None and rc is not None
        bits = [f"p90 {_fmt('{:.2f}', _ratio(pc['ttft_p90_s'], rc['ttft_p90_s']))}x round robin"]
        if ac is not None:
            bits.append(f"{_fmt('{:.2f}', _ratio(pc['ttft_p90_s'], ac['ttft_p90_s']))}x approximate")
        bits.append(f"output {_fmt('{:.2f}', _ratio(pc['output_tok_s'], rc['output_tok_s']))}x round robin")
        bits.append(f"cached {_fmt('{:.0%}', pc['cached_share_of_ceiling'])} of ceiling")
        res.append({"name": f"(context) tenants at {r_:g} rps", "met": None, "detail": ", ".join(bits)})
    return res


def _unique_goals(doc: dict[str, Any]) -> list[dict[str, Any]]:
    rr = _cells(doc, "unique", "round_robin")
    res = []
    for ours in ("precise", "approximate"):
        mine = _cells(doc, "unique", ours)
        common = [c["offered_rate_rps"] for c in rr if _at(mine, c["offered_rate_rps"]) is not None]
        if not common:
            res.append({"name": f"unique: {ours} within 5% of round robin", "met": None, "detail": "not measured"})
            continue
        rate = max(common)
        r, m = _at(rr, rate), _at(mine, rate)
        assert r is not None and m is not None
        t = _ratio(m["ttft_p90_s"], r["ttft_p90_s"])
        o = _ratio(m["output_tok_s"], r["output_tok_s"])
        met = t is not None and o is not None and t <= 1.05 and o >= 0.95
        res.append(
            {
                "name": f"unique: {ours} within 5% of round robin",
                "met": met,
                "detail": f"at {rate:g} rps: TTFT p90 {_fmt('{:.3f}', m['ttft_p90_s'])} vs "
                f"{_fmt('{:.3f}', r['ttft_p90_s'])} s ({_fmt('{:.2f}', t)}x), output "
                f"{m['output_tok_s']:.0f} vs {r['output_tok_s']:.0f} tok/s ({_fmt('{:.2f}', o)}x)",
            }
        )
    return res  # fmt: skip


def _peer_goal(doc: dict[str, Any], workload: str) -> dict[str, Any]:
    """Precise against the best (lowest TTFT p90) peer policy at every rate precise ran; met only if precise is
    below it at each rate where that peer completed every request."""
    name = f"{workload}: precise TTFT p90 below the best peer"
    parts, met = [], True
    for mine in _cells(doc, workload, "precise"):
        rate = mine["offered_rate_rps"]
        peers = [(c["ttft_p90_s"], peer) for peer in PEERS
                 if (c := _at(_cells(doc, workload, peer), rate)) is not None and _completed(c)
                 and c["ttft_p90_s"] is not None]  # fmt: skip
        if not peers or mine["ttft_p90_s"] is None:
            continue
        best, peer = min(peers)
        met = met and mine["ttft_p90_s"] < best
        parts.append(f"{rate:g} rps: {mine['ttft_p90_s']:.3f} s vs {peer} {best:.3f} s "
                     f"({mine['ttft_p90_s'] / best:.2f}x)")  # fmt: skip
    if not parts:
        return {"name": name, "met": None, "detail": "no peer completed a rate that precise also ran"}
    return {"name": name, "met": met, "detail": "; ".join(parts)}


def _table(doc: dict[str, Any], workload: str) -> list[str]:
    w = doc["workloads"][workload]
    lines = ["| policy | " + " | ".join(h for h, _, _ in COLUMNS) + " |",
             "|---|" + "---:|" * len(COLUMNS)]  # fmt: skip
    for policy, entry in w["policies"].items():
        if entry.get("status") != "ok":
            lines.append(f"| {policy} | unavailable: {entry.get('reason', '')[:160]} |" + " |" * (len(COLUMNS) - 1))
            continue
        for c in entry["cells"]:
            row = [_fmt(f, c.get(k)) for _, k, f in COLUMNS]
            lines.append(f"| {policy} | " + " | ".join(row) + " |")
    return lines


def _tenant_table(doc: dict[str, Any], workload: str) -> list[str]:
    """Per tenant, per policy and rate (cells whose plan named tenants: ``by_tenant``): TTFT p90, output, cached."""
    rows = []
    for policy, entry in doc["workloads"][workload]["policies"].items():
        for cell in entry.get("cells", []):
            for tenant, t in sorted(cell.get("by_tenant", {}).items()):
                rows.append(f"| {policy} | {cell['offered_rate_rps']:g} | {tenant} | {_fmt('{:.3f}', t['ttft_p90_s'])} "
                            f"| {_fmt('{:.1f}', t['output_tok_s'])} | {_fmt('{:.2f}', t['cached_token_share'])} "
                            f"| {_fmt('{:.2f}', t['success_rate'])} |")  # fmt: skip
    if not rows:
        return []
    return ["", "Per tenant:", "", "| policy | rate | tenant | TTFT p90 s | output tok/s | cached share | ok |",
            "|---|---:|---|---:|---:|---:|---:|", *rows]  # fmt: skip


def _summary(doc: dict[str, Any]) -> list[str]:
    """One row per policy, one column per workload: TTFT p90 / output tok/s / cached share of the ceiling at
    each workload's highest rate (``–``: the policy did not reach it)."""
    names = list(doc["workloads"])
    tops = {n: max(w["rates_rps"]) for n, w in doc["workloads"].items()}
    lines = ["| policy | " + " | ".join(f"{n} @ {tops[n]:g} rps" for n in names) + " |",
             "|---|" + "---:|" * len(names)]  # fmt: skip
    for policy in _ran(doc):
        row = []
        for n in names:
            cell = _at(_cells(doc, n, policy), tops[n])
            if cell is None:
                row.append("–")
                continue
            ok = "" if cell["success_rate"] >= 1.0 else f" ({cell['success_rate']:.0%} ok)"
            row.append(f"{_fmt('{:.2f}', cell['ttft_p90_s'])} s{_spread(cell)} / {cell['output_tok_s']:.0f} / "
                       f"{_fmt('{:.0%}', cell['cached_share_of_ceiling'])}{ok}")  # fmt: skip
        lines.append(f"| {policy} | " + " | ".join(row) + " |")
    return lines


def _ran(doc: dict[str, Any]) -> list[str]:
    """The policies that ran on at least one workload (``--policies auto`` lists every one it might run)."""
    return [p for p in doc["policies"] if any(p in w["policies"] for w in doc["workloads"].values())]


def _spread(cell: dict[str, Any]) -> str:
    """`` (lo–hi)`` of TTFT p90 over a cell's repeated runs (``--repeat``), or nothing."""
    p90s = [r["ttft_p90_s"] for r in cell.get("repeats", []) if r.get("ttft_p90_s") is not None]
    return f" ({min(p90s):.2f}–{max(p90s):.2f})" if len(p90s) > 1 else ""


def _diagnostics(doc: dict[str, Any]) -> list[str]:
    """Our pickers' decision reasons and index failures per cell (why a policy did what it did)."""
    lines = []
    for n, w in doc["workloads"].items():
        for policy, entry in w["policies"].items():
            for c in entry.get("cells") or []:
                counters = c.get("picker_counters")
                if counters:
                    pretty = ", ".join(f"{k.replace('decisions', '').strip('{}')}: {v}" for k, v in counters.items())
                    if "predicted_cached_tokens" in c:
                        pretty += (f"; predicted {c['predicted_cached_tokens']} cached tokens, the backends reported "
                                   f"{c['cached_tokens']}")  # fmt: skip
                    err = c.get("ttft_estimate_error")
                    if err:
                        p50, p90 = (f"<= {q:g}" if q is not None else "> 5" for q in (err["p50_le"], err["p90_le"]))
                        pretty += (f"; TTFT estimate error per endpoint-interval: mean {err['mape']:.0%}, p50 {p50}, "
                                   f"p90 {p90}, actual/predicted "
                                   f"{err['actual_over_predicted']:g} ({err['intervals']:g} intervals)")  # fmt: skip
                    lines.append(f"- {n} @ {c['offered_rate_rps']:g} rps, {policy}: {pretty}")
    return lines


def _time_note(meta: dict[str, Any]) -> str:
    if meta.get("engine") == "vllm-cpu":
        return ("**Absolute times are a CPU's**: vLLM's CPU build serving a tiny random-weight Qwen3, one engine per "
                "core of a machine that also runs the client and the routers, measured by one asyncio client through "
                "each router on 127.0.0.1. They mean nothing for a GPU; compare the shape and the cached share "
                "within a run.")  # fmt: skip
    return ("**Absolute times are the simulator's**: an H100/Llama-3-8B roofline model (`vllm-sim`), slowed by each "
            "workload's time scale, measured by one asyncio client through each router on 127.0.0.1. Compare "
            "policies within a run; do not read the seconds as a GPU's.")  # fmt: skip


def render(doc: dict[str, Any], plots: list[str], notes: str = "") -> str:
    meta = doc["meta"]
    m = meta["machine"]
    out = [
        "# Routing benchmark",
        "",
        f"Command: `{meta['command']}` (seed {meta['seed']}, git {meta.get('git_commit') or '?'}), "
        f"{meta.get('started_utc', '?')} to {meta.get('finished_utc', 'unfinished')}.",
        f"Machine: {m['cpus']} CPUs ({m['cpu_model']}), {m['platform']}, Python {m['python']}; "
        "shared with other jobs, so small differences are noise.",
        f"Peers: {', '.join(f'{k} {v}' for k, v in meta['versions'].items())}.",
        *([f"Uncommitted changes at start: {', '.join(meta['dirty_paths'])}."] if meta.get("dirty_paths") else []),
        *([f"Picker overrides: `{meta['picker_set']}`."] if meta.get("picker_set") else []),
        "",
        _time_note(meta),
        "",
        "Every cell starts with every backend's prefix cache reset, and each rung of a rate ladder sends text no "
        "router has seen. `cached` = backend-reported cached prompt tokens / prompt tokens; `of ceiling` = that "
        "over what an infinite cache would hit on the same requests. `spread cv` = coefficient of variation of "
        "requests per backend (0 = even). Router CPU: picker replicas (+ valkey) or the peer process; Envoy apart.",
        "",
        "## Goals",
        "",
        "| goal | met | measured |",
        "|---|---|---|",
    ]
    for g in goals(doc):
        mark = {True: "yes", False: "**no**", None: "–"}[g["met"]]
        out.append(f"| {g['name']} | {mark} | {g['detail']} |")
    out += [
        "",
        "## Summary",
        "",
        "TTFT p90 / output tokens/s / cached share of the ceiling, at each workload's highest rate.",
        "",
    ]
    out += _summary(doc)
    if notes:
        out += ["", "## Notes (written after the run)", "", notes.strip()]
    out += ["", "## Policies", ""]
    out += [f"- `{n}`: {POLICIES[n].summary if n in POLICIES else doc['policies'][n]}" for n in _ran(doc)]
    for name, w in doc["workloads"].items():
        f = w["fleet"]
        ceilings = ", ".join(f"{c:.2f}" for c in w["ceiling_cached_share"])
        out += ["", f"## {name}", "", f"{w['summary']}.", "",
                f"Fleet: {f['backends']} backends x {f['num_gpu_blocks']} KV blocks of {f.get('block_size', 16)} "
                f"({f['kv_tokens_per_backend']} tokens each), profile {f['profile']}, time scale {f['time_scale']:g}. "
                f"Rates {w['rates_rps']} req/s, "
                f"{w['requests_per_rate']} requests; ceiling cached share {ceilings}.", ""]  # fmt: skip
        out += _table(doc, name)
        out += _tenant_table(doc, name)
        png = f"{_slug(name)}.png"
        if png in plots:
            out += ["", f"![{name}]({png})"]
    diagnostics = _diagnostics(doc)
    if diagnostics:
        out += ["", "## Picker decisions", "", "Decisions by reason and index failures of our pickers, per cell, "
                "and the cached tokens they predicted against what the backends reported "
                "(`cache`: warm endpoint; `load`: no useful prefix; `spill`: warm endpoint passed over for load; "
                "`hold`: busy warm endpoint kept, no idle one with room; `move`: left the warm endpoint, the copy "
                "spread over the prefix's reuse costing less than its queue).",
                "", *diagnostics]  # fmt: skip
    return "\n".join(out) + "\n"


def _slug(name: str) -> str:
    return name.replace(":", "_").replace("/", "_")


def plot(doc: dict[str, Any], out: Path) -> list[str]:
    """One PNG per workload: TTFT p90, output tokens/s and cached share against the offered rate."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []
    for name, w in doc["workloads"].items():
        fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
        for policy, entry in w["policies"].items():
            cells = entry.get("cells") or []
            if not cells:
                continue
            color = plt.get_cmap("tab20")(list(POLICIES).index(policy) % 20)
            style = "-" if POLICIES[policy].ours else ("--" if POLICIES[policy].peer else ":")
            marker = "o" if policy in OURS else ("s" if POLICIES[policy].peer else "^")
            rates = [c["offered_rate_rps"] for c in cells]
            for ax, key in zip(axes, ("ttft_p90_s", "output_tok_s", "cached_token_share"), strict=True):
                ys = [c[key] if c[key] is not None else float("nan") for c in cells]
                ax.plot(rates, ys, style, marker=marker, label=policy, linewidth=1.4, markersize=4, color=color)
        axes[0].set_yscale("log")
        axes[0].set_title("TTFT p90 (s, log)")
        axes[1].set_title("output tokens/s")
        axes[2].set_title("cached share of prompt tokens")
        ceil = w["ceiling_cached_share"]
        axes[2].plot(w["rates_rps"][: len(ceil)], ceil, "k-", linewidth=3, alpha=0.25, label="ceiling")
        for ax in axes:
            ax.set_xlabel("offered rate (req/s)")
            ax.grid(alpha=0.3)
        axes[2].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
        fig.suptitle(f"{name}: {w['summary']}", fontsize=9)
        fig.tight_layout()
        png = f"{_slug(name)}.png"
        fig.savefig(out / png, dpi=90)
        plt.close(fig)
        written.append(png)
    return written


def write(out: Path, plots: bool = True) -> None:
    doc = json.loads((out / "results.json").read_text())
    written = plot(doc, out) if plots else []
    notes = out / "notes.md"
    (out / "report.md").write_text(render(doc, written, notes.read_text() if notes.exists() else ""))
