"""One coordinator's ``/metrics``: the exporter fed by its events and its RPC interceptor."""

from __future__ import annotations

import contextlib
import sys
from types import TracebackType
from typing import TYPE_CHECKING, Self, TextIO

from fedlink.coordinator.service import CoordinatorService
from fedlink.metrics.events import EventLog
from fedlink.observe.prometheus import PrometheusExporter
from fedlink.observe.rpc import RpcMetricsInterceptor

if TYPE_CHECKING:  # grpc: the caller has loaded it already
    from fedlink.coordinator.server import CoordinatorServer


class MetricsEndpoint:
    """Prometheus metrics for the coordinator that writes ``events``.

    Create it before the ``CoordinatorServer`` (so it sees ``run_started`` and every call),
    pass ``interceptor`` to the server, then ``watch(server.service)`` for the live gauges and
    ``start`` the HTTP endpoint. ``close`` (or leaving the ``with`` block) stops it.
    """

    def __init__(self, events: EventLog) -> None:
        self._service: CoordinatorService | None = None
        self.exporter = PrometheusExporter(live=self._live)
        events.subscribe(self.exporter.observe)
        self.interceptor = RpcMetricsInterceptor(self.exporter.observe_rpc)
        self.port = 0

    def watch(self, service: CoordinatorService) -> None:
        """Read the live gauges (clients, upload sessions, spool bytes) from ``service``."""
        self._service = service

    def start(self, host: str, port: int) -> int:
        """Serve ``http://host:port/metrics`` (0: a free port); returns the bound port."""
        self.port = self.exporter.serve(host, port)
        return self.port

    def close(self) -> None:
        """Stop serving (idempotent)."""
        self.exporter.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _live(self) -> dict[str, float]:
        service = self._service
        if service is None:
            return {}
        return {"connected": float(len(service.registry)),
                "upload_sessions": float(service.uploads.open_uploads()),
                "spool_bytes": float(service.uploads.held_bytes())}


def serve_metrics(server: CoordinatorServer, stack: contextlib.ExitStack,
                  out: TextIO | None = None) -> MetricsEndpoint:
    """Start ``server``'s Prometheus endpoint on its ``[coordinator.metrics]`` host and port
    (closed with ``stack``) and say where it listens on ``out`` (stdout by default).

    Call it before the server starts: its interceptor is added to the server's, and the
    endpoint sees ``run_started`` (``fedlink serve``, and ``fedlink simulate`` over gRPC).
    """
    settings = server.config.metrics
    endpoint = stack.enter_context(MetricsEndpoint(server.events))
    server.interceptors = (endpoint.interceptor, *server.interceptors)
    endpoint.watch(server.service)
    port = endpoint.start(settings.host, settings.port)
    print(f"fedlink metrics on http://{settings.host}:{port}/metrics",
          file=sys.stdout if out is None else out, flush=True)
    return endpoint
