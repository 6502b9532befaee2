"""The ext_proc adapter: Envoy external processing in, ``HttpRequest`` to the router, decisions out.

Only this package imports the ext_proc stubs (``extproc.protocol.pb``, generated from ``protos/``).
"""

from extproc.protocol.exchange import ProcessorOptions
from extproc.protocol.handler import RouteHandler, ServedListener
from extproc.protocol.server import RunningServer, start_server

__all__ = ["ProcessorOptions", "RouteHandler", "RunningServer", "ServedListener", "start_server"]
