"""Rebuilding a gRPC method handler around wrapped behaviours: the one place that knows the
four handler kinds, shared by the server interceptors (auth, RPC metrics)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

Wrap = Callable[[Callable[..., Any]], Callable[..., Any]]


def rewrapped(handler: grpc.RpcMethodHandler, unary: Wrap,
              streaming: Wrap) -> grpc.RpcMethodHandler:
    """``handler`` with its behaviour wrapped: ``unary`` for calls answering one message
    (unary and client-streaming), ``streaming`` for calls answering a stream."""
    h: Any = handler
    common = {"request_deserializer": h.request_deserializer,
              "response_serializer": h.response_serializer}
    if h.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(unary(h.unary_unary), **common)
    if h.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(unary(h.stream_unary), **common)
    if h.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(streaming(h.unary_stream), **common)
    return grpc.stream_stream_rpc_method_handler(streaming(h.stream_stream), **common)
