"""The Prometheus exporter: a coordinator's run as live metrics on ``/metrics``.

:class:`PrometheusExporter` subscribes to the coordinator's event log (the same events that
``events.jsonl`` and ``summary.json`` are made of, so the counters agree with the summary),
times every RPC through :class:`fedlink.observe.rpc.RpcMetricsInterceptor`, and reads a few
gauges live from the coordinator at scrape time.

Every name carries the ``fedlink_`` prefix and its unit; every label has a bounded set of
values (outcomes, gRPC status code names, directions, client states, RPC method names of the
registered services). Nothing is labelled per client, task or reason text.

==================================================  =========================================
``fedlink_model_version``                           current global model version (gauge)
``fedlink_rounds_total``                            flushes (model versions made)
``fedlink_clients``\\ ``{state}``                     ``connected`` (joined, not left),
                                                    ``selected`` (holding a task) and
                                                    ``silent`` (a task released for silence)
``fedlink_tasks_issued_total``                      tasks handed out
``fedlink_updates_total``\\ ``{outcome,code}``        updates ``accepted`` (code ``OK``) and
                                                    ``refused`` by gRPC status code
``fedlink_transfer_bytes_total``\\ ``{direction}``    update bytes received (``up``) and model
                                                    bytes sent (``down``), as in summary.json
``fedlink_upload_sessions``                         upload sessions open now (gauge)
``fedlink_spool_bytes``                             bytes held by open upload sessions (gauge)
``fedlink_round_duration_seconds``                  histogram of each flush's round length
``fedlink_flush_interval_seconds``                  histogram of the time between flushes
``fedlink_rpc_duration_seconds``\\ ``{method}``       histogram of server-side call latency
``fedlink_rpcs_total``\\ ``{method,code}``            finished calls by gRPC status code
``fedlink_dp_epsilon``                              privacy spent so far (DP runs; gauge)
``fedlink_run_finished``                            1 once the run has finished (gauge)
==================================================  =========================================

``prometheus_client`` is an optional extra (``pip install 'fedlink[metrics]'``); this module
is imported only when metrics are turned on.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from fedlink.errors import ConfigError
from fedlink.metrics.events import Event

try:
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.exposition import start_http_server
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ConfigError("Prometheus metrics need prometheus_client: "
                      "pip install 'fedlink[metrics]'") from exc

LiveGauges = Callable[[], Mapping[str, float]]
"""Returns ``upload_sessions`` and ``spool_bytes`` (and ``connected`` clients) right now."""

DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                    120.0, 300.0)


class PrometheusExporter:
    """Coordinator metrics in their own ``CollectorRegistry``, served over HTTP on request.

    Feed it events with :meth:`observe` (``EventLog.subscribe(exporter.observe)``) and RPC
    timings with :meth:`observe_rpc`; ``live`` is read at every scrape. :meth:`serve` starts
    the HTTP endpoint, :meth:`close` stops it.
    """

    def __init__(self, live: LiveGauges | None = None) -> None:
        self.registry = CollectorRegistry()
        self._lock = threading.Lock()
        self._open_tasks: dict[str, str] = {}  # task id -> client id, while it holds a place
        self._silent: set[str] = set()
        self._last_flush_at: float | None = None
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._define()
        self.registry.register(_LiveCollector(self, live))

    def _define(self) -> None:
        r = self.registry
        self.version = Gauge("fedlink_model_version", "Current global model version.",
                             registry=r)
        self.rounds = Counter("fedlink_rounds", "Flushes: model versions made.", registry=r)
        self.tasks = Counter("fedlink_tasks_issued", "Tasks handed out to clients.", registry=r)
        self.updates = Counter("fedlink_updates", "Updates by outcome and gRPC status code.",
                               ["outcome", "code"], registry=r)
        self.bytes = Counter("fedlink_transfer_bytes", "Payload bytes: up = updates "
                             "received, down = models sent.", ["direction"], registry=r)
        self.round_seconds = Histogram("fedlink_round_duration_seconds", "Length of each "
                                       "round, from its start to its flush.",
                                       buckets=DURATION_BUCKETS, registry=r)
        self.flush_interval = Histogram("fedlink_flush_interval_seconds", "Time between "
                                        "consecutive flushes.", buckets=DURATION_BUCKETS,
                                        registry=r)
        self.rpc_seconds = Histogram("fedlink_rpc_duration_seconds", "Server-side latency of "
                                     "each call.", ["method"], buckets=DURATION_BUCKETS,
                                     registry=r)
        self.rpcs = Counter("fedlink_rpcs", "Finished calls by method and gRPC status code.",
                            ["method", "code"], registry=r)
        self.epsilon = Gauge("fedlink_dp_epsilon", "Differential privacy spent so far.",
                             registry=r)
        self.finished = Gauge("fedlink_run_finished", "1 once the run has finished.",
                              registry=r)
        self.updates.labels("accepted", "OK")
        for direction in ("up", "down"):
            self.bytes.labels(direction)

    # -- feeding -------------------------------------------------------------------------------

    def observe(self, event: Event) -> None:
        """Count one coordinator event (an ``EventLog`` subscriber)."""
        handler = self._HANDLERS.get(str(event.get("kind")))
        if handler is not None:
            with self._lock:
                handler(self, event)

    def observe_rpc(self, method: str, code: str, seconds: float) -> None:
        """Record one finished call (the RPC interceptor's callback)."""
        self.rpc_seconds.labels(method).observe(seconds)
        self.rpcs.labels(method, code).inc()

    def _task_issued(self, event: Event) -> None:
        self.tasks.inc()
        client = str(event.get("client_id"))
        self._open_tasks[str(event.get("task_id"))] = client
        self._silent.discard(client)

    def _accepted(self, event: Event) -> None:
        self.updates.labels("accepted", "OK").inc()
        self.bytes.labels("up").inc(_number(event.get("bytes_up")))
        self._open_tasks.pop(str(event.get("task_id")), None)

    def _refused(self, event: Event) -> None:
        self.updates.labels("refused", str(event.get("code") or "UNKNOWN")).inc()
        self.bytes.labels("up").inc(_number(event.get("bytes_up")))
        self._open_tasks.pop(str(event.get("task_id")), None)

    def _download(self, event: Event) -> None:
        self.bytes.labels("down").inc(_number(event.get("bytes")))

    def _timeout(self, event: Event) -> None:
        self._open_tasks.pop(str(event.get("task_id")), None)
        self._silent.add(str(event.get("client_id")))

    def _left(self, event: Event) -> None:
        client = str(event.get("client_id"))
        self._silent.discard(client)
        for task, owner in list(self._open_tasks.items()):
            if owner == client:
                del self._open_tasks[task]

    def _flush(self, event: Event) -> None:
        self.rounds.inc()
        if event.get("model_version") is not None:
            self.version.set(_number(event["model_version"]))
        if event.get("round_seconds") is not None:
            self.round_seconds.observe(_number(event["round_seconds"]))
        elapsed = event.get("elapsed")
        if isinstance(elapsed, int | float):
            if self._last_flush_at is not None:
                self.flush_interval.observe(max(0.0, elapsed - self._last_flush_at))
            self._last_flush_at = float(elapsed)
        epsilon = _epsilon(event)
        if epsilon is not None:
            self.epsilon.set(epsilon)

    def _finished(self, event: Event) -> None:
        self.finished.set(1)
        self._open_tasks.clear()

    _HANDLERS: Mapping[str, Callable[[PrometheusExporter, Event], None]] = {
        "task_issued": _task_issued,
        "update_accepted": _accepted,
        "update_refused": _refused,
        "download_finished": _download,
        "client_timeout": _timeout,
        "client_left": _left,
        "flush": _flush,
        "run_finished": _finished,
    }

    def client_states(self) -> dict[str, float]:
        """``selected`` and ``silent`` client counts from the events seen so far."""
        with self._lock:
            return {"selected": float(len(set(self._open_tasks.values()))),
                    "silent": float(len(self._silent))}

    # -- serving -------------------------------------------------------------------------------

    def serve(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Serve ``/metrics`` on ``host:port`` (0: a free port) in a daemon thread; returns
        the bound port."""
        if self._server is not None:
            raise RuntimeError("the metrics endpoint is already serving")
        try:
            self._server, self._thread = start_http_server(port, addr=host,
                                                           registry=self.registry)
        except OSError as exc:
            raise ConfigError(f"metrics endpoint: cannot listen on {host}:{port}: {exc}") \
                from exc
        return int(self._server.server_address[1])

    def close(self) -> None:
        """Stop the HTTP endpoint (idempotent)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join()
            self._thread = None


class _LiveCollector(Collector):
    """Gauges read at scrape time: client states, upload sessions and spool bytes."""

    def __init__(self, exporter: PrometheusExporter, live: LiveGauges | None) -> None:
        self._exporter = exporter
        self._live = live

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """Yield the live gauges (nothing of ``live`` when the exporter has none)."""
        values = dict(self._live()) if self._live is not None else {}
        clients = GaugeMetricFamily("fedlink_clients", "Clients by state.", labels=["state"])
        states = self._exporter.client_states()
        if "connected" in values:
            states["connected"] = values["connected"]
        for state in ("connected", "selected", "silent"):
            if state in states:
                clients.add_metric([state], states[state])
        yield clients
        for name, doc in (("upload_sessions", "Upload sessions open now."),
                          ("spool_bytes", "Bytes held by open upload sessions.")):
            if name in values:
                yield GaugeMetricFamily(f"fedlink_{name}", doc, value=values[name])


def _number(value: Any) -> float:
    """A finite float from an event field (missing, null or non-finite count as 0)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0.0
    return number if math.isfinite(number) else 0.0


def _epsilon(event: Event) -> float | None:
    """The epsilon a flush reports, at its top level or in its ``privacy`` record."""
    privacy = event.get("privacy")
    value = privacy.get("epsilon") if isinstance(privacy, Mapping) else event.get("epsilon")
    return None if value is None else _number(value)
