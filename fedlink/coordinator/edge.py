"""The coordinator's gRPC edge: what every call meets before the servicer sees it.

- ``EdgeInterceptor`` parses requests itself: a body that is not the message the method takes
  is answered ``INVALID_ARGUMENT`` with fedlink's wording (gRPC's own answer is ``UNKNOWN``
  naming a Python exception class), and every call runs ``calling_from`` its peer address, so
  the ``Join`` limits (``fedlink.coordinator.admission``) know who is calling.
- ``connection_options``: the server's caps on one HTTP/2 connection (concurrent streams, idle
  time, age), from ``LimitsConfig``.
- ``insecurity_warnings``: what is unsafe about serving on an address as configured, for one
  loud log line each at start-up.
"""

from __future__ import annotations

import ipaddress
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from fedlink.coordinator.admission import calling_from
from fedlink.coordinator.config import CoordinatorConfig, LimitsConfig
from fedlink.wire.options import stream_window_options

CONNECTION_AGE_GRACE_S = 300.0
"""How long calls in flight may finish on a connection past ``connection_age_s``."""


class _Malformed:
    """Stands for a request body that did not parse (``detail`` says what it should be)."""

    def __init__(self, detail: str) -> None:
        self.detail = detail


def _lenient(deserializer: Callable[[bytes], Any] | None,
             method: str) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None

    def parse(body: bytes) -> Any:
        try:
            return deserializer(body)
        except Exception:  # any parse failure is the client's malformed body
            name = method.rsplit("/", 1)[-1]
            return _Malformed(f"malformed request: the body of {name} does not parse as its "
                              "fedlink.v1 message")
    return parse


class EdgeInterceptor(grpc.aio.ServerInterceptor):
    """Refuses malformed bodies with ``INVALID_ARGUMENT``; runs each call ``calling_from``."""

    async def intercept_service(
            self, continuation: Callable[[grpc.HandlerCallDetails],
                                         Awaitable[grpc.RpcMethodHandler]],
            handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        """Wrap the method's handler (health and reflection included)."""
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        return _wrap(handler, str(getattr(handler_call_details, "method", "")))


def _wrap(handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
    h: Any = handler
    common = {"request_deserializer": _lenient(h.request_deserializer, method),
              "response_serializer": h.response_serializer}

    async def check(request: Any, context: grpc.aio.ServicerContext) -> None:
        if isinstance(request, _Malformed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.detail)

    async def checked_stream(requests: AsyncIterator[Any],
                             context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async for request in requests:
            await check(request, context)
            yield request

    def unary_in(behavior: Callable[..., Any]) -> Callable[..., Any]:
        async def run(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await check(request, context)
            with calling_from(context.peer()):
                return await behavior(request, context)
        return run

    def stream_in(behavior: Callable[..., Any]) -> Callable[..., Any]:
        async def run(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
            with calling_from(context.peer()):
                return await behavior(checked_stream(requests, context), context)
        return run

    def unary_in_stream_out(behavior: Callable[..., Any]) -> Callable[..., Any]:
        async def run(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            await check(request, context)
            with calling_from(context.peer()):
                async for message in behavior(request, context):
                    yield message
        return run

    if h.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(unary_in(h.unary_unary), **common)
    if h.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(stream_in(h.stream_unary), **common)
    if h.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(unary_in_stream_out(h.unary_stream),
                                                    **common)
    return handler  # no bidirectional streams in fedlink.v1 or the standard services


def connection_options(limits: LimitsConfig) -> list[tuple[str, int | str]]:
    """gRPC server options capping one connection (streams, idle time, age; 0: no cap) and
    its stream window, and how many connections the server holds at once."""
    options: list[tuple[str, int | str]] = stream_window_options(limits.stream_window_bytes)
    if limits.max_streams_per_connection:
        options.append(("grpc.max_concurrent_streams", limits.max_streams_per_connection))
    if limits.connection_idle_s:
        options.append(("grpc.max_connection_idle_ms", int(limits.connection_idle_s * 1000)))
    if limits.connection_age_s:
        options.append(("grpc.max_connection_age_ms", int(limits.connection_age_s * 1000)))
        options.append(("grpc.max_connection_age_grace_ms", int(CONNECTION_AGE_GRACE_S * 1000)))
    if limits.max_connections:
        options.append(("grpc.max_allowed_incoming_connections", limits.max_connections))
    return options


def is_loopback(address: str) -> bool:
    """Whether ``host:port`` listens on this machine only (``localhost``, 127/8, ``::1``)."""
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def insecurity_warnings(config: CoordinatorConfig, address: str) -> list[str]:
    """One line for each unsafe thing about serving ``config`` on ``address`` (none on
    loopback, where nothing crosses a network)."""
    if is_loopback(address) or config.tls.enabled:
        return []
    warnings = [f"serving on {address} in plaintext: anyone on the path reads and alters "
                "every model and update; set [coordinator.tls] cert_file and key_file"]
    if config.auth.enabled or config.join_token:
        key = "[coordinator.auth]" if config.auth.enabled else "join_token"
        warnings.append(f"{key} tokens travel in the clear without TLS and can be replayed by "
                        "anyone who sees one; set [coordinator.tls] cert_file and key_file")
    else:
        warnings.append(f"serving on {address} with no client authentication: anyone who "
                        "reaches the port can join; set [coordinator.auth] secret_file (or "
                        "join_token) and [coordinator.tls]")
    return warnings
