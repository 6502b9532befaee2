"""Pure helpers of the differential suite: what of an answer, an event batch or a metrics page is compared.

``shape`` keeps a JSON value's structure (keys, list lengths, value types) and drops its values: generated text,
ids and timestamps differ between a dummy-weight engine and the simulator; structure must not.
"""

from __future__ import annotations

import re
from typing import Any

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="')


def shape(value: Any) -> Any:
    """Structure of a JSON value: dicts keep their keys, lists their length, scalars become their type name
    (``None`` stays ``None``: a null field and a missing one are different to a client)."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [shape(v) for v in value]
    if value is None:
        return None
    return type(value).__name__


def events_of(payload: Any) -> tuple[list[Any], Any]:
    """A decoded KVEventBatch ``[ts, events, data_parallel_rank]`` without its timestamp."""
    return list(payload[1]), payload[2] if len(payload) > 2 else "absent"


def metric_labels(text: str, prefix: str = "vllm:") -> dict[str, frozenset[str]]:
    """``{sample name: label names}`` of every sample starting with ``prefix`` (label sets of one name merged)."""
    out: dict[str, set[str]] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or not match.group(1).startswith(prefix):
            continue
        out.setdefault(match.group(1), set()).update(_LABEL.findall(match.group(3) or ""))
    return {name: frozenset(labels) for name, labels in out.items()}


def error_view(status: int, body: Any) -> tuple[int, Any]:
    """What a client branches on in an error: the status, the error object's keys, its ``type`` and ``param``
    (for pydantic's "Bad Request" only that it names the body: vLLM adds a JSON position to it). A success
    is just its status (its shape is compared elsewhere)."""
    if status == 200:
        return status, None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        err = body["error"]
        param = err.get("param")
        if err.get("type") == "Bad Request" and isinstance(param, str):
            param = param.split(".")[0]
        return status, (sorted(err), err.get("type"), param)
    if isinstance(body, dict) and "detail" in body:
        return status, ("detail", shape(body["detail"]))
    return status, shape(body)
