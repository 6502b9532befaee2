"""The P/D benchmark's pure parts: the summary of what the client saw, and the stack's P/D wiring."""

from __future__ import annotations

import pytest

from bench.pd_bench import Timing, report, summarize
from bench.stack_config import pd_sim_args, picker_config
from extproc.config import RouterConfig


def test_the_summary_counts_gaps_tokens_and_failures() -> None:
    results = [
        Timing(ok=True, ttft_s=1.0, gaps_s=[0.1, 0.1, 0.4], tokens=4, end_s=12.0),
        Timing(ok=True, ttft_s=3.0, gaps_s=[0.2], tokens=2, end_s=10.0),
        Timing(),
    ]
    s = summarize(results, t0=10.0)
    assert (s["ok"], s["failed"]) == (2, 1)
    assert s["ttft_p50_s"] == pytest.approx(2.0)
    assert s["output_tokens_per_s"] == pytest.approx(6 / 2.0)
    assert s["tpot_p90_s"] == pytest.approx(0.2)
    row = {"workload": {"name": "long"}, "target": "ours_pd", **s}
    assert "| long | ours_pd | 2/1 |" in report({"long/ours_pd": row})


def test_pd_pools_get_the_connector_and_decode_the_sidecar_and_the_picker_their_roles() -> None:
    assert "--sim-pd-sidecar" in pd_sim_args("decode") and "--sim-pd-sidecar" not in pd_sim_args("prefill")
    assert "--kv-transfer-config" in pd_sim_args("prefill")
    config = picker_config(["127.0.0.1:1", "127.0.0.1:2"], roles={"127.0.0.1:2": "prefill"})
    roles = [e.role for e in RouterConfig.model_validate(config).endpoints]
    assert roles == ["both", "prefill"]


def test_repeat_summary_takes_ratios_within_each_run_and_medians_across() -> None:
    from bench.pd_repeat import report as repeat_report

    def run(pd_tok: float, agg_tok: float) -> dict[str, dict[str, float]]:
        return {
            "peak/ours_pd": {"output_tokens_per_s": pd_tok},
            "peak/ours_aggregated": {"output_tokens_per_s": agg_tok},
        }

    text = repeat_report([run(100, 200), run(300, 300), run(150, 200)])
    assert "| peak | ours_pd | 3 | - | - | - | - | 150 [100-300] |" in text
    assert "| peak | - | - | - | - | 0.750 [0.500-1.000] |" in text
