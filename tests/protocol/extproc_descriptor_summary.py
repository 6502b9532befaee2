"""Summaries of protobuf file descriptors, for comparing our ext_proc protos with Envoy's published ones.

Run as a script it imports the *published* stubs (xds-protos) and prints their summary as JSON; it must run in
its own process, because our protos declare the same full names and one descriptor pool cannot hold both.

Shape: {"messages": {full_name: {field: [number, type, repeated, type_name, oneof]}},
        "enums": {full_name: {value_name: number}},
        "services": {full_name: {method: [input, output, client_streaming, server_streaming]}}}
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Iterable
from typing import Any

PUBLISHED_MODULES = (
    "envoy.service.ext_proc.v3.external_processor_pb2",
    "envoy.config.core.v3.base_pb2",
    "envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2",
    "envoy.type.v3.http_status_pb2",
)
OUR_MODULES = (
    "extproc.protocol.pb.external_processor_pb2",
    "extproc.protocol.pb.core_pb2",
    "extproc.protocol.pb.processing_mode_pb2",
    "extproc.protocol.pb.http_status_pb2",
)


def _field(f: Any) -> list[object]:
    sub = f.message_type or f.enum_type
    oneof = f.containing_oneof.name if f.containing_oneof else ""
    return [f.number, f.type, bool(f.is_repeated), sub.full_name if sub else "", oneof]


def _message(m: Any, out: dict[str, Any]) -> None:
    out["messages"][m.full_name] = {f.name: _field(f) for f in m.fields}
    for e in m.enum_types:
        out["enums"][e.full_name] = {v.name: v.number for v in e.values}
    for nested in m.nested_types:
        _message(nested, out)


def summarize(files: Iterable[Any]) -> dict[str, Any]:
    """Summary of every message, enum and service declared in ``files`` (FileDescriptors)."""
    out: dict[str, Any] = {"messages": {}, "enums": {}, "services": {}}
    for fd in files:
        for m in fd.message_types_by_name.values():
            _message(m, out)
        for e in fd.enum_types_by_name.values():
            out["enums"][e.full_name] = {v.name: v.number for v in e.values}
        for s in fd.services_by_name.values():
            out["services"][s.full_name] = {
                m.name: [
                    m.input_type.full_name,
                    m.output_type.full_name,
                    m.client_streaming,
                    m.server_streaming,
                ]
                for m in s.methods
            }
    return out


def summarize_modules(names: Iterable[str]) -> dict[str, Any]:
    return summarize(importlib.import_module(n).DESCRIPTOR for n in names)


if __name__ == "__main__":
    json.dump(summarize_modules(sys.argv[1:] or PUBLISHED_MODULES), sys.stdout, sort_keys=True)
