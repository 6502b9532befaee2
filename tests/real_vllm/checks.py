"""Requests through Envoy and the picker to real engines, each checked against what the engine itself reported.

``checked(fleet, tally, name, path, body)`` sends one request (``stream`` bodies are read as SSE, their usage
taken from the final chunk), then reads Envoy's access-log line for it and asserts:
  - status 200, one attempt, and the engine that served (``%UPSTREAM_HOST%``) is the picker's first choice;
  - the picker's prediction (``x-router-cached-tokens``) == the engine's ``usage.prompt_tokens_details.cached_tokens``.
Every result goes into ``Tally`` first, so the session summary counts failures too.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from tests.real_vllm.fleet import Fleet


@dataclass(frozen=True)
class Checked:
    """One request: what the picker predicted and chose, what the engine reported and which one served."""

    name: str
    status: int
    prompt_tokens: int
    predicted: int
    reported: int
    picked: str
    served: str
    reason: str

    @property
    def exact(self) -> bool:
        return self.predicted == self.reported

    @property
    def served_the_pick(self) -> bool:
        return self.served == self.picked


@dataclass
class Tally:
    """Every ``Checked`` of the session."""

    results: list[Checked] = field(default_factory=list)

    @property
    def checked(self) -> int:
        return len(self.results)

    def summary(self) -> str:
        exact = sum(r.exact for r in self.results)
        hits = sum(r.reported > 0 for r in self.results)
        served = sum(r.served_the_pick for r in self.results)
        return (f"{exact} of {self.checked} predictions exact ({hits} cache hits reported by the engine), "
                f"served == picked {served} of {self.checked}")  # fmt: skip


def post_json(url: str, body: dict[str, Any] | bytes, timeout_s: float = 120.0) -> tuple[int, Any]:
    """POST and parse the JSON answer (error statuses too); a ``stream`` body's SSE lines become a list of
    decoded ``data:`` chunks (``[DONE]`` kept as the string)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, _decode(resp.read(), resp.headers.get("content-type", ""))
    except urllib.error.HTTPError as err:
        return err.code, _decode(err.read(), err.headers.get("content-type", ""))


def _decode(raw: bytes, content_type: str) -> Any:
    if content_type.startswith("text/event-stream"):
        chunks: list[Any] = []
        for line in raw.decode().splitlines():
            if line.startswith("data: "):
                payload = line[len("data: ") :]
                chunks.append(payload if payload == "[DONE]" else json.loads(payload))
        return chunks
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


def usage_of(answer: Any) -> dict[str, Any]:
    """The usage object of a JSON answer, or of the last SSE chunk that carries one."""
    if isinstance(answer, list):
        usages = [c["usage"] for c in answer if isinstance(c, dict) and c.get("usage")]
        return dict(usages[-1])
    return dict(answer["usage"])


def cached_tokens(usage: dict[str, Any]) -> int:
    details = usage.get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)


def checked(fleet: Fleet, tally: Tally, name: str, path: str, body: dict[str, Any]) -> Checked:
    """Send ``body`` through Envoy, record and assert (see the module docstring); waits for the request's KV
    events to reach the picker before returning, so the next request sees them."""
    assert fleet.envoy is not None
    before = len(fleet.envoy.access_log())
    status, answer = post_json(fleet.url(path), body)
    entry = fleet.envoy.wait_for_access_log(before + 1)[before]
    usage = usage_of(answer) if status == 200 else {}
    result = Checked(
        name=name, status=status, prompt_tokens=int(usage.get("prompt_tokens", -1)),
        predicted=int(entry.cached or 0), reported=cached_tokens(usage),
        picked=entry.dest.split(",")[0], served=entry.upstream, reason=entry.reason,
    )  # fmt: skip
    tally.results.append(result)
    fleet.wait_ingest_quiet()
    assert status == 200, f"{name}: {status} {answer}"
    assert entry.attempts == 1, f"{name}: {entry}"
    assert result.served_the_pick, f"{name}: picked {result.picked}, served by {result.served}"
    assert result.exact, f"{name}: predicted {result.predicted} cached tokens, the engine reported {result.reported}"
    return result
