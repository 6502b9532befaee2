"""Fixtures shared by the ext_proc protocol tests."""

from tests.protocol.extproc_wire import each_grpc_server

__all__ = ["each_grpc_server"]
