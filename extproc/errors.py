"""Error types, each with the HTTP status it becomes. ``protocol/`` maps them to responses in one place."""

from __future__ import annotations


class RouterError(Exception):
    """A request the router refuses; ``status`` and ``code`` shape the OpenAI-style error body."""

    status: int = 400
    code: str = "invalid_request_error"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class BadRequest(RouterError):
    status = 400


class UnknownModel(RouterError):
    status = 404
    code = "model_not_found"


class BodyTooLarge(RouterError):
    status = 413
    code = "request_too_large"


class UnsupportedMediaType(RouterError):
    status = 415


class NoEndpoint(RouterError):
    status = 503
    code = "no_endpoint_available"


class Overloaded(RouterError):
    status = 429
    code = "overloaded"
