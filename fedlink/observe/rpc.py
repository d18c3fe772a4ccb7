"""A ``grpc.aio`` server interceptor that times every call and records its status code.

It wraps the handler of every registered method (the Coordinator, health and reflection
services), so the method label only takes the names of methods that exist: an unknown method
has no handler and is not counted. Streaming calls are timed from their first to their last
message.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from fedlink.coordinator.handlers import rewrapped

RpcObserver = Callable[[str, str, float], None]
"""Called with the method name (``Service/Method`` short form), status code name, seconds."""


class RpcMetricsInterceptor(grpc.aio.ServerInterceptor):
    """Reports ``(method, code, seconds)`` of every finished call to ``observe``."""

    def __init__(self, observe: RpcObserver) -> None:
        self._observe = observe

    async def intercept_service(
            self, continuation: Callable[[grpc.HandlerCallDetails],
                                         Awaitable[grpc.RpcMethodHandler]],
            handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        """Wrap the method's handler with timing (``None`` passes through: unknown method)."""
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        details: Any = handler_call_details
        return _timed(handler, method_label(str(details.method)), self._observe)


def method_label(path: str) -> str:
    """``/fedlink.v1.Coordinator/Join`` -> ``Coordinator/Join`` (package dropped)."""
    service, _, method = path.lstrip("/").partition("/")
    return f"{service.rsplit('.', 1)[-1]}/{method}"


def _code(context: grpc.aio.ServicerContext, failed: bool) -> str:
    """The call's status code name: what the handler set or aborted with, else OK/UNKNOWN."""
    code: Any = context.code()
    if isinstance(code, grpc.StatusCode):
        return str(code.name)
    return "UNKNOWN" if failed else "OK"


def _timed(handler: grpc.RpcMethodHandler, method: str,
           observe: RpcObserver) -> grpc.RpcMethodHandler:
    """``handler`` with each call's duration and code reported to ``observe``."""

    def unary(behavior: Callable[..., Any]) -> Callable[..., Any]:
        async def run(request: Any, context: grpc.aio.ServicerContext) -> Any:
            started, failed = time.perf_counter(), True
            try:
                result = await behavior(request, context)
                failed = False
                return result
            finally:
                observe(method, _code(context, failed), time.perf_counter() - started)
        return run

    def streaming(behavior: Callable[..., Any]) -> Callable[..., Any]:
        # a streaming handler either yields its replies or writes them (health's Watch):
        # writing works for both, so the wrapper writes what an async generator yields
        async def run(request: Any, context: grpc.aio.ServicerContext) -> None:
            started, failed = time.perf_counter(), True
            try:
                replies = behavior(request, context)
                if isinstance(replies, AsyncIterator):
                    async for message in replies:
                        await context.write(message)
                else:
                    await replies
                failed = False
            finally:
                observe(method, _code(context, failed), time.perf_counter() - started)
        return run

    return rewrapped(handler, unary, streaming)
