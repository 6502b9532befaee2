"""Our ext_proc protos must be a wire-compatible subset of Envoy's published ones (xds-protos).

Every message, field, enum value and RPC we declare must exist in the published descriptors with the same
number, type, cardinality, message/enum type and oneof. We may declare fewer. The published side loads in a
subprocess: the two sets share full names and cannot live in one descriptor pool.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.protocol.extproc_descriptor_summary import OUR_MODULES, summarize_modules

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def published() -> dict[str, Any]:
    script = HERE / "extproc_descriptor_summary.py"
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def ours() -> dict[str, Any]:
    return json.loads(json.dumps(summarize_modules(OUR_MODULES)))


def _pairs(ours: dict[str, Any], section: str) -> list[tuple[str, str]]:
    return [(name, item) for name, items in ours[section].items() for item in items]


def test_ours_declares_what_we_need(ours: dict[str, Any]) -> None:
    assert "envoy.service.ext_proc.v3.ExternalProcessor" in ours["services"]
    assert ours["messages"]["envoy.service.ext_proc.v3.ProcessingRequest"]["protocol_config"][0] == 11
    assert len(_pairs(ours, "messages")) > 60


def mismatches(ours: dict[str, Any], published: dict[str, Any], section: str) -> list[str]:
    """Each declaration of ours that the published summary lacks or describes differently."""
    found = []
    for name, item in _pairs(ours, section):
        theirs = published[section].get(name, {}).get(item)
        if theirs != ours[section][name][item]:
            found.append(f"{name}.{item}: ours={ours[section][name][item]} published={theirs}")
    return found


@pytest.mark.parametrize("section", ["messages", "enums", "services"])
def test_every_declaration_matches_published(section: str, ours: dict[str, Any], published: dict[str, Any]) -> None:
    assert not mismatches(ours, published, section), "\n".join(mismatches(ours, published, section))


@pytest.mark.parametrize(
    ("section", "name", "item", "index", "value"),
    [
        ("messages", "envoy.service.ext_proc.v3.ProcessingRequest", "request_body", 0, 5),
        ("messages", "envoy.config.core.v3.HeaderValue", "raw_value", 1, 9),
        ("messages", "envoy.service.ext_proc.v3.HeaderMutation", "set_headers", 2, False),
        ("messages", "envoy.service.ext_proc.v3.BodyMutation", "streamed_response", 4, ""),
        ("services", "envoy.service.ext_proc.v3.ExternalProcessor", "Process", 3, False),
    ],
    ids=["number", "type", "cardinality", "oneof", "streaming"],
)
def test_comparison_catches_a_wrong_declaration(
    ours: dict[str, Any],
    published: dict[str, Any],
    section: str,
    name: str,
    item: str,
    index: int,
    value: object,
) -> None:
    tampered = json.loads(json.dumps(ours))
    tampered[section][name][item][index] = value
    assert mismatches(tampered, published, section) != []


def test_comparison_catches_a_wrong_enum_value(ours: dict[str, Any], published: dict[str, Any]) -> None:
    tampered = json.loads(json.dumps(ours))
    tampered["enums"]["envoy.extensions.filters.http.ext_proc.v3.ProcessingMode.BodySendMode"]["BUFFERED"] = 3
    assert mismatches(tampered, published, "enums") != []


def test_every_message_exists_published(ours: dict[str, Any], published: dict[str, Any]) -> None:
    # catches an empty message we declared under a wrong name (it has no fields to compare)
    assert set(ours["messages"]) <= set(published["messages"])
    assert set(ours["enums"]) <= set(published["enums"])
