"""``bench.cell_trace``'s pure parts: reading decision lines, joining the three views of a request, the summary."""

import json

import pytest

from bench.cell_trace import decisions, join, summary, trace_name
from bench.suite.client import Result
from bench.suite.fleet import merge_config, parse_picker_set
from bench.suite.workloads import Call, Plan, Session


def test_decision_lines_are_read_by_request_id_and_other_lines_skipped() -> None:
    line = {"request_id": "p0", "tenant": "premium", "endpoint": "a:1", "reason": "share", "ms": {"total": 0.9}}
    due = {"due_s": {"a:1": 0.01}, "request_id": "p1", "endpoint": "a:1", "reason": "cache"}  # optional keys first
    log = "\n".join([
        "2026-12-02 05:56:25,749 INFO extproc.decision " + json.dumps(line),
        "2026-12-02 05:56:25,749 INFO extproc.decision " + json.dumps(due),
        '2026-12-02 05:56:25,750 INFO extproc.decision {"request_id": "x", "rejected": 429, "error": "busy"}',
        "2026-12-02 05:56:25,751 INFO extproc.app ready",
        '2026-12-02 05:56:25,752 INFO extproc.decision {"request_id": "cut',
    ])  # fmt: skip
    assert decisions(log) == {"p0": line, "p1": due}


def test_join_and_summary_split_client_ttft_into_queue_prefill_and_overhead() -> None:
    plan = Plan("t", (Session(0.0, (Call("p0", (1, 2), 4, "premium"),)), Session(0.1, (Call("b0", (3,), 4, "batch"),))))
    results = [
        Result("b0", True, 0.1, ttft_s=0.5, response_id="cmpl-b"),
        Result("p0", True, 0.0, ttft_s=0.3, response_id="cmpl-p"),
    ]
    served = {"cmpl-p": ("a:1", {"arrival_s": 5.0, "model_queue_s": 0.1, "model_ttft_s": 0.25})}
    rows = join(plan, results, served, {"p0": {"endpoint": "a:1", "reason": "share", "ms": {"total": 0.9}}})
    assert [r["rid"] for r in rows] == ["p0", "b0"]
    assert rows[0]["backend"] == "a:1" and rows[0]["reason"] == "share" and rows[0]["picker_ms"] == 0.9
    assert rows[1]["backend"] == "" and rows[1]["model_ttft_s"] is None  # no record: left out of the summary
    text = summary(rows)
    assert "premium: n 1  p90 ttft 0.300  queue 0.100  prefill 0.150  overhead 0.050  per backend {'a:1': 1}" in text
    assert "batch: n 0" in text


def test_a_repeated_rate_gets_a_trace_file_per_cell() -> None:
    assert trace_name("precise", [6.0, 12.0], 1) == "trace-precise-12.jsonl"
    names = [trace_name("precise", [6.0, 6.0, 12.0], step) for step in range(3)]
    assert names == ["trace-precise-6-cell0.jsonl", "trace-precise-6-cell1.jsonl", "trace-precise-12.jsonl"]


def test_picker_set_items_are_read_as_sections_of_yaml_values() -> None:
    """``--picker-set`` as ``python -m bench`` and ``bench.cell_trace`` read it (``bench.suite.fleet``)."""
    got = parse_picker_set(["scrape.interval_s=0.3", "scheduling.cost_model={learn: false}", "scrape.narrow_pages=no"])
    assert got == {"scrape": {"interval_s": 0.3, "narrow_pages": False}, "scheduling": {"cost_model": {"learn": False}}}
    for bad in ["interval_s=0.3", "scrape.interval_s", ".x=1", "scheduling..learn=1", "scheduling.cost_model.=1"]:
        with pytest.raises(SystemExit, match=r"SECTION\.KEY=VALUE"):
            parse_picker_set([bad])


def test_picker_set_keys_may_reach_into_nested_sections() -> None:
    got = parse_picker_set(["scheduling.cost_model.learn=false", "scheduling.cost_model.learning_rate=0.1",
                            "scheduling.fallbacks=1"])  # fmt: skip
    assert got == {"scheduling": {"cost_model": {"learn": False, "learning_rate": 0.1}, "fallbacks": 1}}
    assert parse_picker_set(["scheduling.cost_model={learn: false}", "scheduling.cost_model.learning_rate=0.1"]) == {
        "scheduling": {"cost_model": {"learn": False, "learning_rate": 0.1}}
    }


def test_picker_set_merges_into_a_policys_overrides_without_dropping_their_keys() -> None:
    overrides = {"tenants": {"classes": [{"name": "premium"}], "shares": {"premium": 0.5}}, "index": {"enabled": True}}
    merge_config(overrides, parse_picker_set(["tenants.shares.batch=0.2", "index.enabled=false"]))
    assert overrides == {
        "tenants": {"classes": [{"name": "premium"}], "shares": {"premium": 0.5, "batch": 0.2}},
        "index": {"enabled": False},
    }
