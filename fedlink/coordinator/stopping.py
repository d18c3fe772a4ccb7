"""Stopping in seconds: the gate a stopping coordinator answers through, and its signals.

A coordinator told to stop (SIGTERM, SIGINT) does not end the run for its clients: with a
``state_dir`` a restarted process goes on with it, and without one the operator still wants
them back when the next run starts. So while it stops it tells every caller to **come back**:
``UNAVAILABLE`` with a ``google.rpc.RetryInfo`` hint (``fedlink.wire.status``), which the client
SDK retries after at least that long. The order (``serve_until_done``) is:

1. ``StopGate.close``: new ``fedlink.v1.Coordinator`` calls are answered ``UNAVAILABLE`` +
   hint at once, and long-polling ``GetTask`` calls waiting for a task are answered so too (a
   task they were just issued stays theirs: ``GetTask`` is idempotent), as are a secure
   group's advertise, share and masked calls waiting for their phase (``LONG_POLLS``);
2. the run's record (``summary.json`` and the model) is written;
3. calls already running (an upload's last chunks, a commit being made durable) get up to
   ``[coordinator] drain_s`` to finish: every update acknowledged before the stop is durable,
   and one in flight is either acknowledged or, cut, retried by its client;
4. the server stops.

Health checks and reflection pass the gate: a probe still sees ``NOT_SERVING`` rather than an
error.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import grpc

from fedlink.aio import cancel_and_wait
from fedlink.coordinator.handlers import rewrapped
from fedlink.proto.v1 import coordinator_pb2 as pb
from fedlink.wire.status import rich_status

SERVICE_PREFIX = "/" + pb.DESCRIPTOR.services_by_name["Coordinator"].full_name + "/"
LONG_POLLS = frozenset(SERVICE_PREFIX + name for name in (
    "GetTask", "SecureAdvertise", "SecureShare", "SecureMasked"))
"""Calls that may wait idle for a long time, and that nothing durable can come of while the
coordinator stops: the gate answers them when it closes. A secure group's advertise, share
and masked phases lead only to later phases, whose calls the closed gate refuses, so its
members are told to come back at once rather than held to ``drain_s``; ``SecureUnmask`` is
not among them: the answers already in may be enough to unmask the group's sum, which is
then flushed and durable."""


class StopGate(grpc.aio.ServerInterceptor):
    """Answers ``fedlink.v1.Coordinator`` calls ``UNAVAILABLE`` + retry hint once ``close``d.

    Also counts the calls running through it, so the stop can wait for them (``idle``), and
    the calls it turned away (``refused``), the evidence a test reads.
    """

    def __init__(self) -> None:
        self.closed = asyncio.Event()
        self.retry_after_s = 1.0
        self.refused = 0
        self.running = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def close(self, retry_after_s: float) -> None:
        """From now on, tell every caller to come back in ``retry_after_s`` seconds."""
        self.retry_after_s = retry_after_s
        self.closed.set()

    @property
    def detail(self) -> str:
        """What a turned-away caller reads."""
        return (f"the coordinator is stopping; come back in {self.retry_after_s:g} s (the run "
                "goes on when it is back)")

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no call runs through the gate, at most ``timeout_s``; whether it is."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout=max(0.0, timeout_s))
        return self._idle.is_set()

    async def intercept_service(
            self, continuation: Callable[[grpc.HandlerCallDetails],
                                         Awaitable[grpc.RpcMethodHandler]],
            handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        """Wrap the Coordinator's handlers (health and reflection pass untouched)."""
        handler = await continuation(handler_call_details)
        method = str(getattr(handler_call_details, "method", ""))
        if handler is None or not method.startswith(SERVICE_PREFIX):
            return handler
        return rewrapped(handler, self._unary(method in LONG_POLLS), self._streaming)

    async def _refuse(self, context: grpc.aio.ServicerContext) -> None:
        self.refused += 1
        await context.abort_with_status(rich_status("UNAVAILABLE", self.detail,
                                                    retry_after_s=self.retry_after_s))

    @contextlib.contextmanager
    def _running(self) -> Iterator[None]:
        self.running += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.running -= 1
            if not self.running:
                self._idle.set()

    def _unary(self, long_poll: bool) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def wrap(behavior: Callable[..., Any]) -> Callable[..., Any]:
            async def run(request: Any, context: grpc.aio.ServicerContext) -> Any:
                if self.closed.is_set():
                    await self._refuse(context)
                if not long_poll:
                    with self._running():
                        return await behavior(request, context)
                # a long poll holds nothing: it is answered when the gate closes
                call = asyncio.ensure_future(behavior(request, context))
                closing = asyncio.ensure_future(self.closed.wait())
                try:
                    await asyncio.wait({call, closing}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    closing.cancel()
                if call.done():
                    return call.result()
                with contextlib.suppress(Exception):
                    await cancel_and_wait(call)
                await self._refuse(context)
            return run
        return wrap

    def _streaming(self, behavior: Callable[..., Any]) -> Callable[..., Any]:
        async def run(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            if self.closed.is_set():
                await self._refuse(context)
            with self._running():
                async for message in behavior(request, context):
                    yield message
        return run


@contextlib.contextmanager
def stop_signals() -> Iterator[asyncio.Event]:
    """An event set by SIGINT or SIGTERM while the ``with`` block runs (on the running loop).

    Installed as early as possible by ``fedlink serve``: a signal that arrives while the
    experiment is still being built is then a stop like any other, not a kill that leaves
    no record.
    """
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        yield stop
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
