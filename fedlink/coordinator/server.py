"""The coordinator process: a ``grpc.aio`` server with health, reflection and clean shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from fedlink.aio import cancel_and_wait
from fedlink.atomic import write_atomic_with
from fedlink.clock import Clock, RealClock
from fedlink.coordinator.auth import TokenVerifier, acting_as, authenticate, load_verifier
from fedlink.coordinator.config import CoordinatorConfig
from fedlink.coordinator.edge import EdgeInterceptor, connection_options, insecurity_warnings
from fedlink.coordinator.faults import NO_FAULTS, FaultPlan
from fedlink.coordinator.handlers import rewrapped
from fedlink.coordinator.inflight import InflightBudget
from fedlink.coordinator.lifecycle import RunLifecycle, StopRule
from fedlink.coordinator.service import CoordinatorService, Evaluator
from fedlink.coordinator.servicer import CoordinatorServicer
from fedlink.coordinator.stopping import StopGate, stop_signals
from fedlink.coordinator.timers import strictly_after, wait_event_or
from fedlink.coordinator.tls import load_server_material
from fedlink.errors import Unauthenticated
from fedlink.metrics import EventLog
from fedlink.params.base import ParamSpec
from fedlink.private import private_dir
from fedlink.proto.v1 import coordinator_pb2 as pb
from fedlink.proto.v1 import coordinator_pb2_grpc as pb_grpc
from fedlink.wire.options import server_options

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Coordinator"].full_name
DRAIN_CAP = 3  # graces a finished coordinator waits for clients that keep calling, at most


class CoordinatorServer:
    """Runs a ``CoordinatorService`` behind gRPC on ``address`` until the run ends or stops.

    Use as an async context manager, or ``start()`` / ``stop()``::

        async with CoordinatorServer(config, model, events) as server:
            print("listening on", server.port)
            await server.wait_finished()
    """

    def __init__(self, config: CoordinatorConfig, initial_model: np.ndarray, events: EventLog,
                 evaluator: Evaluator | None = None, address: str = "127.0.0.1:0",
                 interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
                 clock: Clock | None = None, stop_rules: Sequence[StopRule] = (),
                 faults: FaultPlan = NO_FAULTS, spec: ParamSpec | None = None) -> None:
        self.config = config
        self.interceptors = tuple(interceptors)  # e.g. RPC metrics, outermost first
        self.address = address
        self.events = events
        self.clock = clock if clock is not None else RealClock()
        self.service = CoordinatorService(config, initial_model, events, evaluator, self.clock,
                                          stop_rules, faults, spec)
        self._server: grpc.aio.Server | None = None
        self.inflight = InflightBudget.for_config(config)
        """Bytes of request messages being read, per connection and in all."""
        self.gate = StopGate()
        """Turns callers away, telling them to come back, once the server is stopping."""
        self._health = health.aio.HealthServicer()
        self._background: list[asyncio.Task[None]] = []
        self.port = 0

    async def start(self) -> int:
        """Bind, start serving and return the bound port."""
        for warning in insecurity_warnings(self.config, self.address):
            log.warning("INSECURE: %s", warning)
        # the observers' interceptors first (outermost): they see what the edge refuses too
        # then the budget of bytes in flight (it decides before a message is read), the stop
        # gate, the edge
        interceptors: list[grpc.aio.ServerInterceptor] = [*self.interceptors, self.inflight,
                                                          self.gate, EdgeInterceptor()]
        if self.config.auth.enabled:  # the secret is read here, never logged
            interceptors.append(AuthInterceptor(load_verifier(self.config.auth,
                                                              self.config.run_name)))
        options = (server_options(self.config.message_cap)
                   + connection_options(self.config.limits))
        server = grpc.aio.server(options=options, interceptors=interceptors)
        pb_grpc.add_CoordinatorServicer_to_server(CoordinatorServicer(self.service), server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
        if self.config.tls.enabled:
            material = load_server_material(self.config.tls)
            credentials = grpc.ssl_server_credentials(
                [(material.private_key, material.certificate_chain)],
                root_certificates=material.client_ca,
                require_client_auth=material.client_ca is not None)
            self.port = server.add_secure_port(self.address, credentials)
        else:
            self.port = server.add_insecure_port(self.address)
        if self.port == 0:
            raise OSError(f"could not bind the coordinator to {self.address}")
        await server.start()
        self._server = server
        for status_name in ("", SERVICE_NAME):
            await self._health.set(status_name, health_pb2.HealthCheckResponse.SERVING)
        resumed = {} if self.service.restored_version is None else {
            "resumed_from_version": self.service.restored_version}
        self.lifecycle.begin(config=self.config.to_dict(), port=self.port,
                             num_parameters=self.service.engine.num_parameters, **resumed)
        self._background = [asyncio.create_task(self.service.keep_time()),
                            asyncio.create_task(self.service.report_flushes())]
        log.info("coordinator listening on port %d", self.port)
        return self.port

    @property
    def lifecycle(self) -> RunLifecycle:
        """The run's lifecycle: ``lifecycle.end(reason)`` ends the run."""
        return self.service.lifecycle

    async def wait_finished(self) -> None:
        """Return once the run is over and its last flush was reported."""
        await self.lifecycle.finished.wait()

    async def drain(self) -> None:
        """After the run: keep answering ``Finished`` until every client has left or gone.

        Without this a client whose update ended the run, or one in a blackout when the last
        flush happened, would find the port closed when it asks for its next task, and retry
        until its budget ran out. A client counts as gone once silent for
        ``limits.finished_grace`` (sized from the liveness settings); one that keeps calling
        is waited for, up to ``DRAIN_CAP`` graces in all.
        """
        grace = self.config.limits.finished_grace
        give_up_at = self.clock.now() + DRAIN_CAP * grace
        while True:
            changed = self.service.changed  # set by a Leave (or any change) after this
            now = self.clock.now()
            gone_at = self.service.all_gone_at(silent_after_s=grace)
            if gone_at is None or now >= give_up_at:
                return
            await wait_event_or(self.clock, changed,
                                strictly_after(now, min(gone_at, give_up_at)))

    async def stop_serving(self, bound_s: float) -> None:
        """Stop within ``bound_s`` seconds, telling clients to come back (``stopping``).

        Callers are turned away ``UNAVAILABLE`` with a retry hint from now on; calls already
        running get what is left of ``bound_s`` to finish (an acknowledged update is durable
        before its answer leaves), then the server stops. The run is ended for this process
        only (``run_finished``, not durable): a coordinator restarted on the same
        ``state_dir`` goes on with it.
        """
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + bound_s
        self.gate.close(retry_after_s=max(bound_s, self.config.limits.retry_after_s))
        await self._health.enter_graceful_shutdown()
        await self.gate.wait_idle(give_up_at - loop.time())
        if self._server is not None and not self.lifecycle.finished.is_set():
            self.lifecycle.end("stopped by signal", durable=False)
            # run_finished comes once the flush the run ended on is reported
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wait_finished(),
                                       timeout=max(0.0, give_up_at - loop.time()))
        await self.stop(grace_s=max(0.0, min(0.5, give_up_at - loop.time())))

    async def stop(self, grace_s: float = 2.0) -> None:
        """Stop accepting calls, let running ones finish for ``grace_s``, then stop."""
        if self._server is None:
            return
        await self._health.enter_graceful_shutdown()
        await self._server.stop(grace_s)
        for task in self._background:
            await cancel_and_wait(task)
        self.service.close()
        self.lifecycle.close()
        self._server = None
        log.info("coordinator stopped")

    async def __aenter__(self) -> CoordinatorServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Checks the bearer token of every ``fedlink.v1.Coordinator`` call.

    A call without a valid token is answered ``UNAUTHENTICATED`` before the servicer sees it;
    a valid one runs ``acting_as`` the token's client name (``fedlink.coordinator.auth``).
    Health checks and reflection pass unchecked, so that probes need no token.
    """

    def __init__(self, secret: TokenVerifier | bytes,
                 clock: Callable[[], float] = time.time) -> None:
        self._secret = secret
        self._clock = clock

    async def intercept_service(
            self, continuation: Callable[[grpc.HandlerCallDetails],
                                         Awaitable[grpc.RpcMethodHandler]],
            handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        """Wrap the Coordinator's handlers with the token check."""
        handler = await continuation(handler_call_details)
        details: Any = handler_call_details
        if handler is None or not str(details.method).startswith(f"/{SERVICE_NAME}/"):
            return handler
        try:
            name = authenticate(self._secret, details.invocation_metadata, self._clock())
        except Unauthenticated as exc:
            return _wrap_handler(handler, "", exc.detail)
        return _wrap_handler(handler, name, "")


def _wrap_handler(handler: grpc.RpcMethodHandler, name: str,
                  denial: str) -> grpc.RpcMethodHandler:
    """``handler`` with its behaviour run as client ``name``, or refused with ``denial``."""

    def unary(behavior: Callable[..., Any]) -> Callable[..., Any]:
        async def run(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if denial:
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, denial)
            with acting_as(name):
                return await behavior(request, context)
        return run

    def streaming(behavior: Callable[..., Any]) -> Callable[..., Any]:
        async def run(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            if denial:
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, denial)
            with acting_as(name):
                async for message in behavior(request, context):
                    yield message
        return run

    return rewrapped(handler, unary, streaming)


async def serve_until_done(server: CoordinatorServer,
                           on_started: Callable[[int], None] | None = None,
                           stop: asyncio.Event | None = None,
                           on_record: Callable[[], object] | None = None) -> None:
    """Serve until the run finishes or a stop is asked, then shut down.

    ``stop``: set to stop (default: SIGINT/SIGTERM, ``stopping.stop_signals``). A stop ends
    within ``[coordinator] drain_s`` (``CoordinatorServer.stop_serving``: clients are told to
    come back). ``on_started`` is called with the bound port once the server listens;
    ``on_record`` writes the run's record (summary and model) and is called **before** any
    waiting at the end (draining a finished run, or a stop's drain), so that a kill during
    either still leaves one; the caller writes it again once the server stopped.
    """
    if stop is None:
        with stop_signals() as signalled:
            await serve_until_done(server, on_started, signalled, on_record)
        return
    record = on_record if on_record is not None else (lambda: None)
    stopped = False
    try:
        port = await server.start()
        if on_started is not None:
            on_started(port)
        done = asyncio.ensure_future(server.wait_finished())
        interrupted = asyncio.ensure_future(stop.wait())
        await asyncio.wait({done, interrupted}, return_when=asyncio.FIRST_COMPLETED)
        if done.done() and not interrupted.done():
            record()
            draining = asyncio.ensure_future(server.drain())
            await asyncio.wait({draining, interrupted}, return_when=asyncio.FIRST_COMPLETED)
            draining.cancel()
        if interrupted.done():
            log.info("stop asked: telling the clients to come back; stopping within %g s",
                     server.config.drain_s)
            server.gate.close(retry_after_s=max(server.config.drain_s,
                                                server.config.limits.retry_after_s))
            record()  # first: whatever comes next, the run's record is on disk
            await server.stop_serving(server.config.drain_s)
            stopped = True
        for fut in (done, interrupted):
            fut.cancel()
    finally:
        if not stopped:
            await server.stop()


def save_model(path: Path, model: np.ndarray) -> None:
    """Write the final global model as a ``.npy`` file (parent folders created), atomically
    and ``0600``."""
    private_dir(path.parent)
    write_atomic_with(path, lambda f: np.save(f, model))
