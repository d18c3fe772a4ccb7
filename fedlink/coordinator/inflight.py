"""Bytes of messages in flight: a budget per connection and in all, taken before a message is read.

A gRPC server holds every request message whole in memory before its handler sees it, and
gRPC core reads a message as soon as the application asks for it. 200 concurrent 7.9 MiB
``Join`` calls on 2 connections once grew the coordinator by more than 1 GiB. Two bounds
now hold at the edge:

- **Message size** (``CoordinatorConfig.message_cap``): no ``fedlink.v1`` message needs more
  than the largest upload chunk or netcheck probe, plus room for its other fields; gRPC core
  refuses a larger one from its length prefix (``RESOURCE_EXHAUSTED``), before reading it.
- **Bytes in flight** (``InflightBudget``, a server interceptor): before a message is read,
  its worst case (the message cap) is reserved from the connection's budget
  (``limits.max_inflight_bytes_per_connection``) and the coordinator's
  (``limits.max_inflight_bytes``); once read, the reservation shrinks to the message's real
  size and is held until its call ends (a stream's, until its next message is asked for).
  A call that does not fit is refused ``RESOURCE_EXHAUSTED`` with a retry hint **without its
  message being read**, and whatever a refused or finished call held is given back at once.
- **Bytes not asked for** (``fedlink.wire.options.server_options``): gRPC core takes a
  stream's data up to the stream's HTTP/2 window before the application asks for a message.
  The coordinator's window is fixed at ``SERVER_STREAM_WINDOW_BYTES`` (64 KiB; BDP probing
  would grow it to megabytes), so per connection core holds at most
  ``max_streams_per_connection`` x 64 KiB of messages the budget has not admitted.

How a message is left unread: the interceptor serves every method as a client-streaming one,
so that the server hands it the request *stream* and reads nothing until the interceptor asks
for the first message; the method's own behaviour then gets that one message as before.
A budget of 0 disables that bound.

**Freed means returned.** A message read and dropped is freed, but the C allocator keeps what
it freed for reuse rather than giving it back to the system: a burst of large requests, each
refused at once, still left the process hundreds of MiB larger (its peak RSS grew by the
burst's bytes, not by the budget). ``FreedMemory`` hands it back (glibc's ``malloc_trim``)
each time another budget's worth of bytes was read, so what a refused call held leaves the
process at once. Two things kept refused messages from being freed at all: gRPC's reader of
a unary call's request stream holds the last message it yielded until it is closed (the
interceptor closes it once the one message is read), and a refusal's exception keeps its
call's frames, the request among them, in a reference cycle that only a full collection
frees: a flood of cap-sized calls refused after they were read grew the coordinator by tens
of MiB between two collections. The interceptor clears the locals of the frames a failed
call's exception passed through, so its request is freed when the call ends (``FreedMemory``
still collects cycles before it trims, for what else is caught in one).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from fedlink.coordinator.config import CoordinatorConfig
from fedlink.errors import ResourceExhausted
from fedlink.wire.status import rich_status

log = logging.getLogger(__name__)

class FreedMemory:
    """Gives memory the allocator keeps back to the system after every ``every_bytes`` read.

    glibc only (``malloc_trim``); elsewhere it does nothing. ``trims`` counts the hand-backs.
    """

    def __init__(self, every_bytes: int) -> None:
        self.every_bytes = every_bytes
        self.trims = 0
        self._read = 0
        self._trim = _malloc_trim()

    def read(self, size: int) -> None:
        """``size`` bytes were read into a message (and are freed when its call ends)."""
        if self._trim is None or not self.every_bytes:
            return
        self._read += size
        if self._read >= self.every_bytes:
            self._read = 0
            gc.collect()  # a refused call's request waits in an exception's frame cycle
            self._trim(0)
            self.trims += 1


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or ``None`` where the C library has none."""
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None
    return trim  # type: ignore[no-any-return]


def _size(message: Any) -> int:
    """Bytes a read message holds (a body that did not parse holds none of its own)."""
    byte_size = getattr(message, "ByteSize", None)
    return int(byte_size()) if callable(byte_size) else 0


async def _close(requests: AsyncIterator[Any]) -> None:
    """End a call's request stream once its one message is read.

    gRPC's reader is a generator that keeps the last message it yielded until it is resumed
    or closed, and a unary call's never is: left open, every refused message stayed alive as
    long as its call's frames did (a flood of refused cap-sized Joins, read one at a time,
    grew the process by their total size).
    """
    stream = aiter(requests)
    close = getattr(stream, "aclose", None)
    if close is not None:
        await close()


def _drop_locals(err: BaseException) -> None:
    """Clear the local variables of the finished frames ``err`` (and the errors it chains)
    passed through: a call's request is one of them, and an exception's frames form a
    reference cycle that kept the request alive until the next full collection."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [err]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)
        pending += [current.__cause__, current.__context__]


class InflightBudget(grpc.aio.ServerInterceptor):
    """Reserves bytes per connection and in all before a request message is read.

    ``refused`` counts the calls turned away, ``peak`` the most bytes ever reserved at once:
    the evidence that the bound held.
    """

    def __init__(self, message_bytes: int, total_bytes: int, per_connection_bytes: int,
                 retry_after_s: float) -> None:
        self.message_bytes = message_bytes
        self.total_bytes = total_bytes
        self.per_connection_bytes = per_connection_bytes
        self.retry_after_s = retry_after_s
        self.held = 0
        self.peak = 0
        self.refused = 0
        self._by_connection: dict[str, int] = {}
        self.freed = FreedMemory(total_bytes or per_connection_bytes or 64 << 20)

    @classmethod
    def for_config(cls, config: CoordinatorConfig) -> InflightBudget:
        """The budget ``config.limits`` asks for."""
        limits = config.limits
        return cls(config.message_cap, limits.max_inflight_bytes,
                   limits.max_inflight_bytes_per_connection, limits.retry_after_s)

    def held_by(self, peer: str) -> int:
        """Bytes reserved for the connection ``peer`` (``context.peer()``)."""
        return self._by_connection.get(peer, 0)

    # -- reservations -------------------------------------------------------------------------

    def _take(self, peer: str, amount: int) -> None:
        """Reserve ``amount`` more bytes for ``peer`` (``ResourceExhausted`` if over a cap)."""
        held = self._by_connection.get(peer, 0)
        per_connection, total = self.per_connection_bytes, self.total_bytes
        if per_connection and held + amount > per_connection:
            self.refused += 1
            raise ResourceExhausted(
                f"this connection has {held} bytes of messages in flight (limit "
                f"{per_connection}); retry once they are in", retry_after_s=self.retry_after_s)
        if total and self.held + amount > total:
            self.refused += 1
            raise ResourceExhausted(
                f"the coordinator has {self.held} bytes of messages in flight (limit "
                f"{total}); retry later", retry_after_s=self.retry_after_s)
        self._by_connection[peer] = held + amount
        self.held += amount
        self.peak = max(self.peak, self.held)

    def _give(self, peer: str, amount: int) -> None:
        """Give back ``amount`` of ``peer``'s reserved bytes."""
        if not amount:
            return
        left = self._by_connection.get(peer, 0) - amount
        if left > 0:
            self._by_connection[peer] = left
        else:
            self._by_connection.pop(peer, None)
        self.held -= amount

    # -- the interceptor ----------------------------------------------------------------------

    async def intercept_service(
            self, continuation: Callable[[grpc.HandlerCallDetails],
                                         Awaitable[grpc.RpcMethodHandler]],
            handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        """Serve the method as client-streaming, reading under the budget."""
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        h: Any = handler
        common = {"request_deserializer": h.request_deserializer,
                  "response_serializer": h.response_serializer}
        if h.unary_unary is not None:
            return grpc.stream_unary_rpc_method_handler(self._one_in(h.unary_unary), **common)
        if h.unary_stream is not None:
            return grpc.stream_stream_rpc_method_handler(self._one_in_stream_out(h.unary_stream),
                                                         **common)
        if h.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(self._many_in(h.stream_unary), **common)
        return grpc.stream_stream_rpc_method_handler(self._many_in_stream_out(h.stream_stream),
                                                     **common)

    async def _refuse(self, context: grpc.aio.ServicerContext, err: ResourceExhausted) -> None:
        await context.abort_with_status(rich_status(err.code, err.detail,
                                                    retry_after_s=err.retry_after_s))

    async def _first(self, requests: AsyncIterator[Any],
                     context: grpc.aio.ServicerContext) -> tuple[Any, int]:
        """The call's one request, read under a reservation; ``(request, bytes held)``: the
        caller gives the held bytes back (``_give``) when the call ends."""
        peer = context.peer()
        try:
            self._take(peer, self.message_bytes)
        except ResourceExhausted as refusal:
            err = refusal  # raised again outside the handler: no frame cycle keeps it
        else:
            try:
                request = await anext(requests)
            except StopAsyncIteration:
                # gRPC ended the call before its message came (over the message cap, or the
                # client cancelled): it has its answer; end quietly, as gRPC's own unary path
                self._give(peer, self.message_bytes)
                raise asyncio.CancelledError from None
            except BaseException:
                self._give(peer, self.message_bytes)
                raise
            await _close(requests)
            size = _size(request)
            self._give(peer, self.message_bytes - size)
            self.freed.read(size)
            return request, size
        await self._refuse(context, err)
        raise AssertionError("unreachable")  # abort always raises

    def _budgeted(self, requests: AsyncIterator[Any],
                  context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        """``requests``, each message read under a reservation held until the next is asked
        for (a refusal is raised to the handler as ``ResourceExhausted``)."""
        peer = context.peer()

        async def stream() -> AsyncIterator[Any]:
            held = 0
            try:
                while True:
                    self._give(peer, held)
                    held = 0
                    self._take(peer, self.message_bytes)
                    held = self.message_bytes
                    try:
                        message = await anext(requests)
                    except StopAsyncIteration:
                        return
                    self._give(peer, held - _size(message))
                    held = _size(message)
                    self.freed.read(held)
                    yield message
            finally:
                self._give(peer, held)

        return stream()

    def _one_in(self, behavior: Callable[..., Any]) -> Callable[..., Any]:
        async def run(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
            peer = context.peer()  # not in `finally`: peer() on an ended call can crash grpc
            request, held = await self._first(requests, context)
            try:
                return await behavior(request, context)
            except BaseException as err:
                del request
                _drop_locals(err)
                raise
            finally:
                self._give(peer, held)
        return run

    def _one_in_stream_out(self, behavior: Callable[..., Any]) -> Callable[..., Any]:
        async def run(requests: AsyncIterator[Any],
                      context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            peer = context.peer()  # not in `finally`: peer() on an ended call can crash grpc
            request, held = await self._first(requests, context)
            try:
                async for message in behavior(request, context):
                    yield message
            except BaseException as err:
                del request
                _drop_locals(err)
                raise
            finally:
                self._give(peer, held)
        return run

    def _many_in(self, behavior: Callable[..., Any]) -> Callable[..., Any]:
        async def run(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
            try:
                return await behavior(self._budgeted(requests, context), context)
            except BaseException as err:
                _drop_locals(err)  # the stream's last message
                raise
        return run

    def _many_in_stream_out(self, behavior: Callable[..., Any]) -> Callable[..., Any]:
        async def run(requests: AsyncIterator[Any],
                      context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            try:
                async for message in behavior(self._budgeted(requests, context), context):
                    yield message
            except BaseException as err:
                _drop_locals(err)  # the stream's last message
                raise
        return run
