"""Logs carry no prompt text: not at INFO (the default), not even at DEBUG, whatever path a request takes.

The real router behind a real gRPC server, logging captured from the root logger at DEBUG. Requests carry a
marker in every field a prompt can hide in (messages, prompt strings, tool schemas, documents, template
kwargs, the salt) and go down every path: routed, tokenization failing, refused as bad input, passed through.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import grpc
import pytest

from bench.stack_config import MODEL
from extproc.protocol import ProcessorOptions, start_server
from extproc.protocol.pb import core_pb2, external_processor_pb2, external_processor_pb2_grpc
from tests.fuzz.inproc import ready_app

pb = external_processor_pb2
SECRET = "quokka-lantern-5521"

BODIES: dict[str, tuple[str, Any]] = {
    "chat": ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": SECRET}]}),
    "completion": ("/v1/completions", {"model": MODEL, "prompt": f"{SECRET} " * 40}),
    "batch": ("/v1/completions", {"model": MODEL, "prompt": [SECRET, SECRET]}),
    "tools-docs": ("/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "system", "content": SECRET}, {"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "f", "description": SECRET, "parameters": {}}}],
        "documents": [{"title": SECRET, "text": SECRET}]}),
    "template-fails": ("/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": SECRET}],
        "chat_template_kwargs": {"messages": SECRET}}),
    "request-template": ("/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": SECRET}], "chat_template": "{{ '" + SECRET + "' }}"}),
    "bad-role": ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": 7, "content": SECRET}]}),
    "bad-content": ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": {"x": SECRET}}]}),
    "bad-prompt": ("/v1/completions", {"model": MODEL, "prompt": [{"text": SECRET}]}),
    "bad-salt": ("/v1/completions", {"model": MODEL, "prompt": "x", "cache_salt": f"{SECRET}/"}),
    "bad-tokens": ("/v1/completions", {"model": MODEL, "prompt": [-1, 5], "suffix": SECRET}),
    "unknown-field-types": ("/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": SECRET}], "stream": SECRET}),
    "truncated": ("/v1/chat/completions", None),
    "not-llm-path": ("/v1/embeddings", {"model": MODEL, "input": SECRET}),
}  # fmt: skip


def messages_for(path: str, body: Any) -> list[pb.ProcessingRequest]:
    raw = json.dumps(body).encode() if body is not None else json.dumps(BODIES["chat"][1]).encode()[:-7]
    headers = {":method": "POST", ":path": path, "content-type": "application/json", "x-request-id": "r"}
    hv = [core_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()]
    first = pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=core_pb2.HeaderMap(headers=hv)))
    first.protocol_config.request_body_mode = 2  # type: ignore[assignment]  # BUFFERED
    return [first, pb.ProcessingRequest(request_body=pb.HttpBody(body=raw, end_of_stream=True))]


class Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))  # includes any exception traceback


@pytest.mark.parametrize("level", [logging.INFO, logging.DEBUG])
async def test_no_prompt_text_in_logs(level: int) -> None:
    capture = Capture()
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(capture)
    root.setLevel(level)
    app = await ready_app()
    server = await start_server(app.router, host="127.0.0.1", port=0, options=ProcessorOptions())
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = external_processor_pb2_grpc.ExternalProcessorStub(channel)
            outcomes = {}
            for name, (path, body) in BODIES.items():
                call = stub.Process(iter(messages_for(path, body)), timeout=10)
                replies = [r async for r in call]
                outcomes[name] = replies[-1].WhichOneof("response")
    finally:
        await server.stop(grace_s=None)
        await app.stop()
        root.removeHandler(capture)
        root.setLevel(old_level)
    assert outcomes["chat"] == "request_body" and outcomes["bad-role"] == "immediate_response"
    assert any("request_id" in line for line in capture.lines), "the decision line itself must be logged"
    if level == logging.DEBUG:  # the failure paths did log (their detail is what could have leaked)
        assert any("tokenization failed" in line for line in capture.lines), capture.lines
    leaked = [line for line in capture.lines if SECRET in line]
    assert not leaked, leaked
