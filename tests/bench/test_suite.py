"""The benchmark suite (``python -m bench``): token-exact words, deterministic plans, their ceiling, the goals,
and one tiny end-to-end run through real Envoy, a picker and the simulator asserting the result shape."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.stack_config import MODEL, REPO, TOKENIZER_CACHE
from bench.suite import report
from bench.suite.policies import POLICIES
from bench.suite.words import SPACE, render, vocabulary
from bench.suite.workloads import WORKLOADS, ceiling_share


def test_words_are_one_token_each_and_a_leading_space_is_one_more() -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(TOKENIZER_CACHE / MODEL / "tokenizer.json"))
    words = vocabulary()
    assert len(words) > 10_000 and words == tuple(sorted(words))
    plan = WORKLOADS["documents"].plan(4.0, 0, 0, True)
    for call in plan.calls[:6]:
        ids = [i for i in call.ids if i != SPACE]
        assert len(tok.encode(render(ids)).ids) == len(ids)
        assert len(tok.encode(render([SPACE, *ids])).ids) == len(ids) + 1


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_plans_are_deterministic_and_salted_per_rung(name: str) -> None:
    w = WORKLOADS[name]
    a, b = w.plan(5.0, 0, 7, True), w.plan(5.0, 0, 7, True)
    assert a == b
    other = w.plan(5.0, 1, 7, True)
    assert {c.ids for c in a.calls}.isdisjoint({c.ids for c in other.calls}) or name == "unique"
    assert 0.0 <= a.ceiling_cached_share() < 1.0


def test_a_rate_on_the_ladder_replays_its_own_cell_wherever_it_stands() -> None:
    """``--rates 12`` alone replays the suite's agents cell at 12 req/s (its second rung), not the first rung's
    requests sent faster; a rate off the ladder, or one given twice, takes a rung past the ladder's by its
    position, so no two cells of one invocation share a rung."""
    w = WORKLOADS["agents"]
    assert list(w.rates_full) == [6.0, 12.0]
    assert w.plans([6.0, 12.0], 7, False) == [w.plan(6.0, 0, 7, False), w.plan(12.0, 1, 7, False)]
    assert w.plans([12.0], 7, False) == [w.plan(12.0, 1, 7, False)]
    assert w.plans([12.0, 6.0], 7, False) == [w.plan(12.0, 1, 7, False), w.plan(6.0, 0, 7, False)]
    assert w.plans([12.0, 12.0], 7, False) == [w.plan(12.0, 2, 7, False), w.plan(12.0, 3, 7, False)]
    assert w.plans([9.0, 6.0], 7, False) == [w.plan(9.0, 2, 7, False), w.plan(6.0, 0, 7, False)]


def test_noisy_premium_arrives_alike_in_every_rung() -> None:
    def premium(rate: float, step: int) -> list[tuple[float, int]]:
        plan = WORKLOADS["noisy"].plan(rate, step, 7, True)
        return [(s.start_s, len(s.calls[0].ids)) for s in plan.sessions if s.calls[0].tenant == "premium"]

    assert premium(0.0, 0) == premium(12.0, 2)
    assert len(premium(12.0, 2)) < len(WORKLOADS["noisy"].plan(12.0, 2, 7, True).sessions)


@pytest.mark.parametrize(
    ("prompts", "expected"),
    [
        ([list(range(32)), list(range(32))], 16 / 64),  # 2nd: first block hits, the last token is never cached
        ([list(range(33)), list(range(33))], 32 / 66),
        ([list(range(32)), [SPACE, *range(32)]], 0.0),  # one leading space shifts every block
        ([list(range(10))] * 3, 0.0),  # no full block
    ],
    ids=["exact-repeat", "one-more-token", "leading-space", "short"],
)
def test_ceiling_share(prompts: list[list[int]], expected: float) -> None:
    assert ceiling_share(prompts) == pytest.approx(expected)


def _cell(rate: float, ok: float, p90: float | None, tok_s: float, share: float = 0.5, ceil: float = 0.5) -> dict:
    return {
        "offered_rate_rps": rate,
        "success_rate": ok,
        "ttft_p90_s": p90,
        "output_tok_s": tok_s,
        "cached_token_share": share,
        "ceiling_cached_share": ceil,
        "cached_share_of_ceiling": share / ceil,
    }


def test_goals_use_the_highest_rate_round_robin_completes() -> None:
    doc = {"workloads": {"tenants": {"prefix_heavy": True, "policies": {
        "round_robin": {"status": "ok", "cells": [_cell(2, 1.0, 1.0, 100), _cell(4, 1.0, 10.0, 120),
                                                   _cell(6, 0.9, 50.0, 100)]},
        "approximate": {"status": "ok", "cells": [_cell(2, 1.0, 0.5, 100), _cell(4, 1.0, 2.0, 150)]},
        "precise": {"status": "ok", "cells": [_cell(2, 1.0, 0.3, 100), _cell(4, 1.0, 0.5, 200, 0.46)]},
        "sglang_cache_aware": {"status": "ok", "cells": [_cell(2, 1.0, 0.4, 100), _cell(4, 0.5, 9.0, 90)]},
    }}}}  # fmt: skip
    goals = {g["name"]: g for g in report.goals(doc)}
    assert goals["precise TTFT p90 <= 0.1x round robin"]["met"] is True  # 0.5 vs 10 at 4 rps
    assert goals["precise TTFT p90 <= 0.5x approximate"]["met"] is True
    assert goals["precise output tok/s >= 1.5x round robin"]["met"] is True
    assert goals["precise cached share >= 90% of ceiling"]["met"] is True
    assert goals["tenants: precise TTFT p90 below the best peer"]["met"] is True  # at 2 rps: 0.3 < 0.4


def test_tenant_goals_say_which_policy_is_missing_or_did_not_complete() -> None:
    def detail(policies: dict) -> str:
        doc = {"workloads": {"tenants": {"policies": policies}}}
        return {g["name"]: g for g in report.goals(doc)}["tenants goals"]["detail"]

    precise = {"status": "ok", "cells": [_cell(4, 1.0, 0.5, 200)]}
    assert detail({"precise": precise}) == "no results from round_robin"
    assert detail({}) == "no results from round_robin, precise"
    failed = {"status": "ok", "cells": [_cell(4, 0.5, 9.0, 90)]}
    assert detail({"round_robin": failed, "precise": precise}) == "round robin did not complete any rate"


def test_repeated_runs_report_the_median_run_and_the_spread() -> None:
    from bench.suite.runner import median_run

    runs = [_cell(4, 1.0, 0.9, 100), _cell(4, 1.0, 0.4, 120), _cell(4, 1.0, None, 90), _cell(4, 1.0, 0.6, 110)]
    cell = median_run(runs)
    assert cell["ttft_p90_s"] == 0.6 and cell["output_tok_s"] == 110  # one whole run: the median by TTFT p90
    assert [r["ttft_p90_s"] for r in cell["repeats"]] == [0.9, 0.4, None, 0.6]
    assert "repeats" not in median_run(runs[:1])
    doc = {"policies": {"precise": {}}, "workloads": {"tenants": {"rates_rps": [4], "policies": {
        "precise": {"status": "ok", "cells": [cell]}}}}}  # fmt: skip
    assert "0.60 s (0.40–0.90)" in "\n".join(report._summary(doc))


def test_help_lists_workloads_and_policies() -> None:
    out = subprocess.run([sys.executable, "-m", "bench", "--help"], capture_output=True, text=True, cwd=REPO,
                         timeout=60, check=True).stdout  # fmt: skip
    for name in (*WORKLOADS, *POLICIES, "trace:PATH"):
        assert name in out


@pytest.mark.envoy
def test_quick_smoke_run_writes_results_report_and_plot(tmp_path: Path) -> None:
    policies = ("round_robin", "precise", "precise_authz")
    cmd = [sys.executable, "-m", "bench", "--quick", "--workload", "none", "--policies", ",".join(policies),
           "--out", str(tmp_path / "out"), "--workdir", str(tmp_path / "work")]  # fmt: skip
    subprocess.run(cmd, cwd=REPO, timeout=180, check=True, capture_output=True)
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    assert doc["meta"]["command"].startswith("python -m bench --quick")
    smoke = doc["workloads"]["smoke"]
    assert set(smoke["policies"]) == set(policies)
    for policy in policies:
        (cell,) = smoke["policies"][policy]["cells"]
        assert cell["success_rate"] == 1.0 and cell["prompt_token_mismatches"] == 0
        for key in (
            "ttft_p50_s",
            "ttft_p90_s",
            "ttft_p99_s",
            "e2e_p50_s",
            "output_tok_s",
            "cached_token_share",
            "ceiling_cached_share",
            "load_spread_cv",
            "router_cpu_s",
            "backend_requests",
        ):
            assert cell[key] is not None, key
        assert sum(cell["backend_requests"]) == cell["requests"]
    for picked in ("precise", "precise_authz"):  # the same picker over ext_proc and over ext_authz
        precise = smoke["policies"][picked]["cells"][0]
        assert precise["cached_token_share"] == pytest.approx(precise["ceiling_cached_share"], abs=0.01), picked
    assert (tmp_path / "out" / "report.md").read_text().startswith("# Routing benchmark")
    assert (tmp_path / "out" / "smoke.png").stat().st_size > 1000
