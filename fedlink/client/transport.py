"""The client's connection to a coordinator: fedlink messages in, fedlink messages out.

This is the client side's only grpc-aware module. It converts through ``fedlink.wire`` and
turns ``grpc.aio.AioRpcError`` into ``fedlink.errors.RemoteError`` subclasses, so the session
and user code never see a grpc type.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from fedlink.client.liveness import (
    LinkEstimate,
    LivenessConfig,
    Progress,
    is_link_dead,
    is_no_reply,
    is_ping_timeout,
    reopen_reason,
)
from fedlink.clock import RealClock
from fedlink.errors import (
    ConfigError,
    Internal,
    NoProgress,
    RemoteError,
    Unavailable,
    remote_error,
)
from fedlink.messages import (
    CommitReply,
    CommitRequest,
    DataChunk,
    DownloadRequest,
    EvaluationAck,
    EvaluationReport,
    GetTaskRequest,
    HeartbeatReply,
    HeartbeatRequest,
    JoinReply,
    JoinRequest,
    LeaveReply,
    LeaveRequest,
    TaskReply,
    UploadChunk,
    UploadReply,
    UploadStatusRequest,
)
from fedlink.proto.v1 import coordinator_pb2_grpc as pb_grpc
from fedlink.wire import from_proto, task_reply_from_proto, to_proto
from fedlink.wire.options import client_channel_options
from fedlink.wire.refusal import refusal_from_call
from fedlink.wire.status import retry_delay

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Timeouts:
    """Per-call deadlines in seconds (``GetTask`` adds the coordinator's long-poll time).

    ``unary_s`` is the floor of a short call's deadline: on a long link it grows to a few
    measured round trips (``fedlink.client.liveness``, bounded by ``max_deadline_s``).
    """

    unary_s: float = 30.0
    transfer_s: float = 600.0
    long_poll_s: float = 15.0


class Lanes:
    """Up to ``count`` more connections beside ``first`` (``Transport.sibling``), which
    striped downloads use (``fedlink.client.transfer.Transfers``): opened on the first call,
    closed by ``close``. ``all`` is every connection opened, ``first`` included."""

    def __init__(self, first: Transport, count: int) -> None:
        self.first = first
        self.count = count
        self._opened: list[Transport] = []

    def __call__(self) -> tuple[Transport, ...]:
        """The connections beside ``first``, opened now if they are not yet."""
        while len(self._opened) < self.count:
            self._opened.append(self.first.sibling())
        return tuple(self._opened)

    @property
    def all(self) -> tuple[Transport, ...]:
        """``first`` and the connections opened beside it."""
        return (self.first, *self._opened)

    async def close(self) -> None:
        """Close the connections opened beside ``first`` (not ``first`` itself)."""
        for lane in self._opened:
            await lane.close()


def translate(exc: grpc.aio.AioRpcError) -> RemoteError:
    """The fedlink error for a failed gRPC call, with the coordinator's ``RetryInfo`` delay.

    Retryability follows from the status code alone (``fedlink.errors``), plus that delay for
    ``RESOURCE_EXHAUSTED``; the message text is never read to decide. A connection broken
    mid-call reaches grpcio (>= 1.85) as ``UNAVAILABLE``, except under a streaming transfer
    (see ``transfer_failure``).
    """
    code, detail = exc.code().name, exc.details() or exc.code().name
    return remote_error(code, detail, retry_delay(exc), reason=refusal_from_call(exc))


def transfer_failure(err: RemoteError) -> RemoteError:
    """``err`` as a failed ``Upload``/``Download`` stream reports it: ``INTERNAL`` is retryable.

    When a connection resets under a client stream, gRPC's core ends the call ``INTERNAL``
    (seen here on links resetting every megabyte), not ``UNAVAILABLE``. A transfer resumes at
    the offset the coordinator holds, so retrying one costs at most a resend; the coordinator's
    own internal error on a transfer is retried within the same bounded budget.
    """
    if isinstance(err, Internal):
        return Unavailable(err.detail)
    return err


@dataclass(frozen=True)
class TLSOptions:
    """TLS to the coordinator: PEM file paths.

    ``ca_file``: the CA that signed the coordinator's certificate (empty: the system's trusted
    roots). ``cert_file`` + ``key_file``: this client's certificate and key, for a coordinator
    that requires mutual TLS (both or neither).
    """

    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""

    def __post_init__(self) -> None:
        if bool(self.cert_file) != bool(self.key_file):
            raise ConfigError("tls: cert_file and key_file go together: set both or neither")

    def credentials(self) -> grpc.ChannelCredentials:
        """gRPC channel credentials from the files (``ConfigError`` if one is unreadable)."""
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca_file, "ca_file"),
            private_key=_read(self.key_file, "key_file"),
            certificate_chain=_read(self.cert_file, "cert_file"))


def _read(path: str, what: str) -> bytes | None:
    if not path:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"tls.{what} {path}: {exc.strerror}") from None


@dataclass
class _Line:
    """One channel to the coordinator, with the ping-ack timeout it was opened with, and
    what its calls have shown of its connection."""

    channel: grpc.aio.Channel
    stub: pb_grpc.CoordinatorStub
    ping_timeout_s: float
    moved_a_transfer: bool = False  # a transfer completed over it
    dead: bool = False  # a call on it failed with its connection gone
    stalled: bool = False  # a transfer on it made no progress for the stall bound
    suspect: bool = False  # a transfer was handed over from it (``Transport.exchange``)


class Transport:
    """An open channel to one coordinator. Use ``async with Transport(target) as t``.

    ``tls``: connect over TLS (else plaintext). ``token``: sent as ``authorization: Bearer``
    metadata on every call, for a coordinator with per-client tokens. ``liveness``: the
    bounds of the link-following timeouts (``fedlink.client.liveness``): ``link`` learns the
    round trip and goodput from completed calls. What it learns applies to the next call's
    deadlines on the open channel; the channel is replaced only when it is known dead and the
    link wants another ping-ack timeout, or when a transfer on it stalled (``reopen_reason``).

    A stalled channel is closed at once and the transfer resumed on a fresh one: measured
    under 25% loss, a connection that had stalled and drained moved the next transfers 3 to 4
    times slower than a fresh one (the sender's slow-start threshold stays where its losses
    left it, and after deep backoff its retransmission timeout stays long, where a fresh
    connection's window can grow tenfold before its first loss), so a stalled connection is
    never reused. ``channels_opened`` counts the channels, ``stalls`` the transfers abandoned
    for making no progress. A transfer with another connection beside it does better:
    ``exchange`` gives this transport that connection and the other one this transport's,
    so the transfer goes on at once over a connection already open and the slow one is kept
    (not reopened) where only striped downloads use it (``handovers`` counts those moves).

    ``private``: every channel gets a connection of its own, never one that gRPC shares among
    channels with the same options: a second ``Transport`` to the same coordinator that
    carries part of each download (``fedlink.client.transfer.Transfers``) must not ride the
    first one's connection. ``link``: the estimate of a link another ``Transport`` already
    measures (the second one's connection crosses the same link; ``liveness`` is then
    ``link.config``).
    """

    def __init__(self, target: str, timeouts: Timeouts | None = None,
                 tls: TLSOptions | None = None, token: str = "",
                 liveness: LivenessConfig | None = None, private: bool = False,
                 link: LinkEstimate | None = None) -> None:
        self.target = target
        self.timeouts = timeouts or Timeouts()
        self.link = link if link is not None else LinkEstimate(liveness)
        self.channels_opened = 0
        self.stalls = 0
        self.handovers = 0
        self._tls = tls
        self._token = token
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None
        self._retiring: set[asyncio.Task[None]] = set()
        self._private = private  # the open channel must not share a connection (see below)
        # round trips and goodput are network facts: measured in real time whatever clock
        # the session runs on
        self._now = RealClock().now
        self._line = self._open_line()

    @property
    def ping_timeout_s(self) -> float:
        """The ping-ack timeout of the channel calls go through now."""
        return self._line.ping_timeout_s

    def sibling(self) -> Transport:
        """Another connection to the same coordinator, never sharing this one's: it crosses
        the same link, so it shares (and feeds) this one's estimate of it."""
        return Transport(self.target, self.timeouts, self._tls, self._token, private=True,
                         link=self.link)

    def _open_line(self) -> _Line:
        cfg = self.link.config
        ping_timeout_s = self.link.channel_ping_timeout_s()
        options = client_channel_options(
            ping_timeout_ms=round(ping_timeout_s * 1000),
            keepalive_time_ms=round(cfg.keepalive_time_s * 1000),
            tcp_user_timeout_ms=round(cfg.tcp_user_timeout_s * 1000))
        if self._private:
            # gRPC shares a connection among channels with identical options: an option of
            # this channel's own keeps it off a stalled connection, and a sibling off the
            # first transport's
            options.append(("fedlink.connection", f"{id(self)}/{self.channels_opened}"))
        if self._tls is None:
            channel = grpc.aio.insecure_channel(self.target, options=options)
        else:
            channel = grpc.aio.secure_channel(self.target, self._tls.credentials(),
                                              options=options)
        self.channels_opened += 1
        return _Line(channel, pb_grpc.CoordinatorStub(channel), ping_timeout_s)

    def _fit_channel(self) -> _Line:
        """The channel to call through: the open one unless ``reopen_reason`` says otherwise.

        A stalled channel is closed at once (its calls are stuck on the same connection); one
        that lost its connection finishes its calls first (``transfer_s`` at most).
        """
        wanted = self.link.channel_ping_timeout_s()
        reason = reopen_reason(self.ping_timeout_s, wanted, self._line.dead, self._line.stalled)
        if reason is None:
            return self._line
        log.info("%s: %s (srtt %s s); new connection", self.target, reason,
                 "?" if self.link.srtt_s is None else f"{self.link.srtt_s:.2f}")
        old, stalled = self._line, self._line.stalled
        if stalled:
            self.link.stalled(fresh_one_too=not old.moved_a_transfer)
        self._private = self._private or stalled
        self._line = self._open_line()
        closing = asyncio.ensure_future(
            old.channel.close(grace=0 if stalled else self.timeouts.transfer_s))
        self._retiring.add(closing)
        closing.add_done_callback(self._retiring.discard)
        return self._line

    @property
    def can_take_over(self) -> bool:
        """Whether this connection may carry a transfer that made no progress on another:
        it is not known dead or stalled, and no transfer was handed over from it since it
        last completed one."""
        line = self._line
        return not (line.dead or line.stalled or line.suspect)

    def exchange(self, other: Transport, why: str) -> None:
        """Swap connections with ``other`` (a transport to the same coordinator over the same
        link, ``sibling``) because a transfer here made no progress (``why``): this
        transport's calls go on over ``other``'s connection at once, and the slow connection,
        marked suspect until it completes a transfer, goes where only striped downloads use
        it."""
        self.handovers += 1
        self._line.suspect = True
        log.info("%s: %s; going on over the other open connection", self.target, why)
        self._line, other._line = other._line, self._line
        # a connection of this transport's own from now on, never one gRPC shares
        self._private = other._private = True

    async def close(self) -> None:
        """Close the channel (and any retired one still finishing its calls)."""
        for closing in list(self._retiring):
            closing.cancel()
        await self._line.channel.close()

    async def __aenter__(self) -> Transport:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _failed(self, exc: grpc.aio.AioRpcError, line: _Line) -> RemoteError:
        """Translate ``exc``, widening the link's timeouts if no reply came at all, and
        marking ``line`` (the call's channel) dead if its connection is gone, unless a
        spell of loss killed it (``LinkEstimate.ping_died``)."""
        detail = exc.details() or ""
        if is_ping_timeout(detail):
            if not self.link.ping_died(line.ping_timeout_s):
                # not marked dead: its timeout is not at fault, and gRPC brings the channel
                # back on a fresh connection by itself (a new channel: one more for nothing)
                log.info("%s: a ping-ack timeout of %.1f s (many round trips) ended a spell "
                         "of loss; the channel reconnects with it", self.target,
                         line.ping_timeout_s)
                return translate(exc)
        elif is_no_reply(exc.code().name, detail):
            self.link.no_reply()
        if is_link_dead(exc.code().name):
            line.dead = True
        return translate(exc)

    def _stall(self, what: str, idle_s: float, line: _Line) -> Unavailable:
        """A transfer on ``line`` made no progress for ``idle_s``: the next call gets a
        fresh connection."""
        self.stalls += 1
        line.stalled = True
        log.info("%s: %s made no progress for %.1f s; resuming on a fresh connection",
                 self.target, what, idle_s)
        return Unavailable(f"{what} stalled: no progress for {idle_s:.1f} s")

    async def _unary(self, name: str, request: Any, timeout: float,
                     round_trip: bool = True) -> Any:
        """Call ``name``; a ``round_trip`` call's duration teaches the link's RTT."""
        line = self._fit_channel()
        started = self._now()
        try:
            reply = await getattr(line.stub, name)(to_proto(request), timeout=timeout,
                                                   metadata=self._metadata)
        except grpc.aio.AioRpcError as exc:
            raise self._failed(exc, line) from None
        if round_trip:
            self.link.observe_rtt(self._now() - started)
        self.link.succeeded()
        return reply

    @property
    def unary_deadline_s(self) -> float:
        """The deadline of a short call now: the configured one, or more on a long link."""
        return self.link.unary_deadline_s(self.timeouts.unary_s)

    async def join(self, request: JoinRequest) -> JoinReply:
        """Call ``Join``."""
        reply: JoinReply = from_proto(await self._unary("Join", request, self.unary_deadline_s))
        return reply

    async def get_task(self, request: GetTaskRequest) -> TaskReply:
        """Call ``GetTask`` (long-polls on the coordinator: not a round-trip sample)."""
        timeout = self.unary_deadline_s + self.timeouts.long_poll_s
        return task_reply_from_proto(await self._unary("GetTask", request, timeout,
                                                       round_trip=False))

    async def upload_status(self, request: UploadStatusRequest) -> UploadReply:
        """Call ``UploadStatus``."""
        reply: UploadReply = from_proto(await self._unary("UploadStatus", request,
                                                          self.unary_deadline_s))
        return reply

    async def commit(self, request: CommitRequest) -> CommitReply:
        """Call ``Commit``."""
        reply: CommitReply = from_proto(await self._unary("Commit", request,
                                                          self.unary_deadline_s))
        return reply

    async def secure(self, name: str, request: Any, phase_s: float) -> Any:
        """Call ``Secure<name>`` (a long-poll of up to ``phase_s``: not a round-trip sample)."""
        return from_proto(await self._unary(f"Secure{name}", request,
                                            self.unary_deadline_s + phase_s, round_trip=False))

    async def report_evaluation(self, request: EvaluationReport) -> EvaluationAck:
        """Call ``ReportEvaluation``."""
        reply: EvaluationAck = from_proto(await self._unary("ReportEvaluation", request,
                                                            self.unary_deadline_s))
        return reply

    async def heartbeat(self, request: HeartbeatRequest) -> HeartbeatReply:
        """Call ``Heartbeat``."""
        reply: HeartbeatReply = from_proto(await self._unary("Heartbeat", request,
                                                             self.unary_deadline_s))
        return reply

    async def leave(self, request: LeaveRequest) -> LeaveReply:
        """Call ``Leave``."""
        reply: LeaveReply = from_proto(await self._unary("Leave", request,
                                                         self.unary_deadline_s))
        return reply

    async def download(self, request: DownloadRequest, progress: Progress | None = None,
                       ) -> AsyncGenerator[DataChunk, None]:
        """Stream ``Download``; chunks arrive as they come (an error may cut the stream).

        A stream is cancelled as stalled once it has not moved for ``link.stall_s()`` since it
        started or last moved, and nor has ``progress`` (given: that of all the streams of one
        striped download), so that a stream stuck beside others that move is left to be
        overtaken, not stalled, while a fresh stream gets a whole stall bound of its own.
        Chunks are asked small enough to show progress well within that bound
        (``LinkEstimate.progress_chunk_bytes``)."""
        request = dataclasses.replace(request, max_chunk_bytes=self.link.progress_chunk_bytes(
            request.max_chunk_bytes))
        line = self._fit_channel()
        call = line.stub.Download(to_proto(request), timeout=self.timeouts.transfer_s,
                                  metadata=self._metadata)
        started, received = self._now(), 0
        own = Progress(self._now)
        streams = (own,) if progress is None else (own, progress)
        try:
            while True:
                message = await self._next_message(call, streams)
                if message is None:
                    raise transfer_failure(self._stall("download", own.idle_s(), line))
                if message is grpc.aio.EOF:
                    break
                for moved in streams:
                    moved.moved()
                chunk: DataChunk = from_proto(message)
                received += len(chunk.data)
                yield chunk
        except grpc.aio.AioRpcError as exc:
            raise transfer_failure(self._failed(exc, line)) from None
        except GeneratorExit:  # the reader has what it asked for: the range it still wants
            self._moved(received, started, line)
            raise
        finally:
            call.cancel()
            self._log_transfer("download", received, started, own)
        self._moved(received, started, line)

    async def _next_message(self, call: Any, progress: tuple[Progress, ...]) -> Any | None:
        """The stream's next message (or ``EOF``); ``None`` once none of ``progress`` (the
        stream's own, since it started, and the striped download's) has moved for the stall
        bound."""
        reading = asyncio.ensure_future(call.read())
        try:
            while True:
                stall_s = self.link.stall_s()
                idle_s = min(p.idle_s() for p in progress)
                done, _ = await asyncio.wait({reading}, timeout=max(0.0, stall_s - idle_s))
                if done:
                    return reading.result()
                if all(p.stalled(stall_s) for p in progress):
                    return None
        finally:
            if not reading.done():
                reading.cancel()

    def _moved(self, num_bytes: int, started: float, line: _Line) -> None:
        """A transfer attempt over ``line`` moved ``num_bytes`` since ``started`` and ended
        well."""
        self.link.observe_transfer(num_bytes, self._now() - started)
        self.link.succeeded()
        line.moved_a_transfer = True
        line.suspect = False

    def _log_transfer(self, what: str, num_bytes: int, started: float,
                      progress: Progress) -> None:
        """A transfer attempt ended (done, cut or stalled): its figures, for a debug log."""
        log.debug("%s: %s of %d bytes ended after %.1f s; longest wait for progress %.1f s "
                  "(stall bound %.1f s)", self.target, what, num_bytes, self._now() - started,
                  max(progress.longest_s, progress.idle_s()), self.link.stall_s())

    async def upload(self, chunks: Iterable[UploadChunk], patience: float = 1.0,
                     ) -> UploadReply:
        """Stream ``Upload`` with ``chunks``; the reply says how many bytes are held.

        gRPC takes the next chunk only when flow control has room, so each one taken is
        progress; once all are taken, the reply may take as long again as the bytes in flight
        need at the measured goodput. A stream without progress for longer is cancelled:
        as stalled, or, with ``patience`` under 1, after that share of the stall bound and
        as ``NoProgress``, leaving the connection unmarked for the caller to ``exchange``.
        """
        sent = 0
        done_sending = False
        progress = Progress(self._now)

        async def messages() -> AsyncIterator[Any]:
            nonlocal sent, done_sending
            for chunk in chunks:
                for piece in self._progress_pieces(chunk):
                    progress.moved()
                    sent += len(piece.data)
                    yield to_proto(piece)
            progress.moved()
            done_sending = True

        started = self._now()
        line = self._fit_channel()
        call = line.stub.Upload(messages(), timeout=self.timeouts.transfer_s,
                                metadata=self._metadata)
        try:
            reply = await self._watch(call, progress, lambda: self._drain_s(sent)
                                      if done_sending else 0.0, patience)
        except grpc.aio.AioRpcError as exc:
            raise transfer_failure(self._failed(exc, line)) from None
        finally:
            call.cancel()  # a no-op once it ended; else it must not go on beside a resume
            self._log_transfer("upload", sent, started, progress)
        if reply is None and patience < 1.0:
            raise NoProgress(f"upload made no progress for {progress.idle_s():.1f} s")
        if reply is None:
            raise transfer_failure(self._stall("upload", progress.idle_s(), line))
        self._moved(sent, started, line)
        result: UploadReply = from_proto(reply)
        return result

    def _progress_pieces(self, chunk: UploadChunk) -> Iterator[UploadChunk]:
        """``chunk`` in pieces small enough to be taken well within the stall bound, as a
        download's chunks are asked (``LinkEstimate.progress_chunk_bytes``)."""
        step = self.link.progress_chunk_bytes(len(chunk.data))
        if step >= len(chunk.data):
            yield chunk
            return
        view = memoryview(chunk.data)
        for start in range(0, len(chunk.data), step):
            yield dataclasses.replace(chunk, offset=chunk.offset + start,
                                      data=bytes(view[start:start + step]))

    def _drain_s(self, in_flight: int) -> float:
        """Extra wait for a reply while ``in_flight`` bytes may still be on their way."""
        goodput = self.link.goodput_bps
        return in_flight / goodput if goodput else 0.0

    async def _watch(self, call: Any, progress: Progress, extra_s: Callable[[], float],
                     patience: float) -> Any | None:
        """The reply of ``call``, or ``None`` (call cancelled) once it made no progress for
        ``patience x link.stall_s() + extra_s()``."""
        waiter = asyncio.ensure_future(call)
        try:
            while True:
                allowed = patience * self.link.stall_s() + extra_s()
                done, _ = await asyncio.wait({waiter}, timeout=max(0.0, allowed
                                                                     - progress.idle_s()))
                if done:
                    return waiter.result()
                if progress.stalled(patience * self.link.stall_s() + extra_s()):
                    call.cancel()
                    return None
        finally:
            if not waiter.done():
                waiter.cancel()
