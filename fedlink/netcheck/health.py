"""``fedlink health HOST:PORT``: ask a coordinator's standard gRPC health service.

For container ``HEALTHCHECK`` lines, systemd and load balancers: exit status 0 when the
coordinator answers ``SERVING``, 1 otherwise (not serving, unreachable, too slow).
"""

from __future__ import annotations

from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def check_health(target: str, service: str = "", timeout_s: float = 5.0,
                 tls_ca: str = "") -> str:
    """The health status name of ``service`` ("" = the whole server) at ``target``.

    ``SERVING`` when healthy; ``UNREACHABLE`` or another gRPC status code name when the
    question could not be asked or answered; ``tls_ca`` (a PEM file) dials over TLS.
    """
    if tls_ca:
        credentials = grpc.ssl_channel_credentials(Path(tls_ca).read_bytes())
        channel = grpc.secure_channel(target, credentials)
    else:
        channel = grpc.insecure_channel(target)
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service),
                               timeout=timeout_s)
        except grpc.RpcError as err:
            code = err.code()  # type: ignore[attr-defined]
            return "UNREACHABLE" if code == grpc.StatusCode.UNAVAILABLE else str(code.name)
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
