"""Hand-written fake route handlers (no mocks): each acts like one kind of router and keeps what it saw."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

from extproc.errors import BadRequest, NoEndpoint, UnknownModel, UnsupportedMediaType
from extproc.types import EndpointId, HttpRequest, PassThrough, Route

A, B, C = EndpointId("10.0.0.1:8000"), EndpointId("10.0.0.2:8000"), EndpointId("10.0.0.3:8000")


@dataclass
class FixedHandler:
    """Answers every request the same way (or raises ``error``); keeps the requests it saw."""

    answer: Route | PassThrough = field(default_factory=lambda: Route((A, B), {"x-router-reason": "cache"}))
    error: BaseException | None = None
    seen: list[HttpRequest] = field(default_factory=list)

    async def route(self, request: HttpRequest) -> Route | PassThrough:
        self.seen.append(request)
        if self.error is not None:
            raise self.error
        return self.answer


@dataclass
class ListeningHandler(FixedHandler):
    """A ``FixedHandler`` that is also a ``BodyListener``: ``events`` lists "coming" and "route" in order."""

    events: list[str] = field(default_factory=list)

    def body_coming(self) -> None:
        self.events.append("coming")

    async def route(self, request: HttpRequest) -> Route | PassThrough:
        self.events.append("route")
        return await super().route(request)


@dataclass
class ModelHandler:
    """A tiny router: validates an OpenAI chat body like the real one; routes ``m`` within the subset."""

    models: dict[str, tuple[EndpointId, ...]] = field(default_factory=lambda: {"m": (A, B, C)})
    served: list[tuple[str, str]] = field(default_factory=list)

    async def route(self, request: HttpRequest) -> Route | PassThrough:
        if request.method == "GET":
            return PassThrough()
        if not request.headers.get("content-type", "").startswith("application/json"):
            raise UnsupportedMediaType("Content-Type must be application/json.")
        body = _json_object(request.body)
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise BadRequest("'model' is required.", param="model")
        if model not in self.models:
            raise UnknownModel(f"The model '{model}' does not exist.", param="model")
        if not body.get("messages"):
            raise BadRequest("'messages' must be a non-empty list.", param="messages")
        eligible = [e for e in self.models[model] if request.subset is None or e in request.subset]
        if not eligible:
            raise NoEndpoint("No endpoint can serve this request.")
        return Route(tuple(eligible), {"x-router-cached-tokens": "0"})

    def on_served(self, request_id: str, endpoint: EndpointId) -> None:
        self.served.append((request_id, endpoint))


def _json_object(raw: bytes) -> dict[str, object]:
    try:
        body = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise BadRequest(f"Request body is not valid JSON: {err}") from None
    if not isinstance(body, dict):
        raise BadRequest("Request body must be a JSON object.")
    return body


@dataclass
class GatedHandler:
    """Requests with header ``x-slow`` wait for ``gate``; others answer at once. Counts concurrent calls."""

    gate: asyncio.Event = field(default_factory=asyncio.Event)
    inner: FixedHandler = field(default_factory=FixedHandler)
    waiting: int = 0

    async def route(self, request: HttpRequest) -> Route | PassThrough:
        if "x-slow" in request.headers:
            self.waiting += 1
            await self.gate.wait()
        return await self.inner.route(request)
