"""Container health check for the picker: ``python healthcheck.py [HOST:PORT] [SERVICE]``.

(Not named grpc_health.py: run as a script, its folder comes first on sys.path and would shadow the
``grpc_health`` package it imports.)

Asks the gRPC health service (``grpc.health.v1.Health/Check``) for ``SERVICE`` (default ``readiness``; the
picker also answers ``liveness`` and ``envoy.service.ext_proc.v3.ExternalProcessor``). Exit 0 when SERVING,
1 otherwise (NOT_SERVING, unknown service, unreachable or slower than 2 s). Docker's HEALTHCHECK and compose's
``healthcheck`` use it; Kubernetes uses its native ``grpc`` probe instead.
"""

from __future__ import annotations

import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def check(target: str, service: str, timeout_s: float = 2.0) -> bool:
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def main(argv: list[str]) -> int:
    target = argv[1] if len(argv) > 1 else "127.0.0.1:9002"
    service = argv[2] if len(argv) > 2 else "readiness"
    return 0 if check(target, service) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
