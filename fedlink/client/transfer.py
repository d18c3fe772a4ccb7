"""Resumable transfers: model downloads (full or delta) and update uploads, in adaptive chunks.

Downloads keep what arrived before a break and ask again from that offset; uploads ask the
coordinator how much it holds (``UploadStatus``) and send the rest, as a stream generated
lazily so that a reset early in the stream wastes no work. ``ChunkSizer`` adapts the chunk size
to the link: smaller after a failed attempt (less is lost to the next reset), larger after a
clean one (less per-message overhead).

A payload of at most the run's ``inline_bytes`` comes inside the ``Task`` (``model_data`` or
``delta_data``) and needs no ``Download``.

A client that holds version ``v`` of the model sends it as ``GetTaskRequest.held_version``;
when the task offers a delta from ``v`` (``Task.delta``), the client downloads that instead of
the full model, rebuilds the new version with ``apply_delta`` and checks it bit for bit against
the model's ``values_checksum`` (the decoded float32 bytes), falling back to the full download
on any mismatch. A coordinator that sends no ``values_checksum`` (before 0.2) is checked by
re-encoding the rebuilt model, which only a client with the same zlib can match.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Protocol, Self, TypeVar

import numpy as np

from fedlink.client.liveness import Progress
from fedlink.client.stats import SessionStats
from fedlink.clock import RealClock
from fedlink.compress import decoder_for
from fedlink.compress.delta import apply_delta
from fedlink.config import require
from fedlink.errors import DataLoss, NoProgress, RemoteError
from fedlink.messages import (
    DataChunk,
    DownloadRequest,
    Task,
    TensorHeader,
    UploadChunk,
    UploadReply,
    UploadStatusRequest,
)
from fedlink.wire import checksum, pack, unpack, values_checksum

log = logging.getLogger(__name__)
T = TypeVar("T")

MIN_CHUNK_BYTES = 16 << 10
MAX_CHUNK_BYTES = 1 << 20
FIRST_CHUNK_BYTES = 64 << 10
"""The most an upload stream's first chunk carries (it tells the coordinator whose it is)."""
STRIPE_MIN_BYTES = 256 << 10
"""The smallest download striped over several connections (``Transfers``)."""
STRIPE_MIN_STEAL_BYTES = 32 << 10
"""The least an idle connection takes over from a busy one by halves (``steal``)."""
MIN_SEGMENT_BYTES = 64 << 10
START_SEGMENT_BYTES = 1 << 20
MAX_SEGMENT_BYTES = 64 << 20
"""Bounds of the bytes one ``Upload`` stream carries before it asks for the coordinator's
answer (see ``Transfers._send``)."""
HANDOVER_PATIENCE = 0.5
"""The share of the stall bound an upload waits for progress before it goes on over another
open connection (``Transfers.upload``): TCP backing off that long has lost several
retransmissions in a row, and the next may be as far away again."""


class Call(Protocol):
    """Runs a call under the session's retry policy (``fedlink.client.retry.Caller``)."""

    async def __call__(self, fn: Callable[[], Awaitable[T]], what: str,
                       transfer: bool = False) -> T:
        """Run ``fn``, retrying retryable failures (``transfer``: a resumable transfer)."""
        ...


class TransferLink(Protocol):
    """The calls a transfer makes (``fedlink.client.transport.Transport`` provides them)."""

    def download(self, request: DownloadRequest, progress: Progress | None = None,
                 ) -> AsyncGenerator[DataChunk, None]:
        """Stream a payload from ``request.offset`` (to ``request.end_offset``, when set);
        stalled once ``progress`` (shared by a striped download's streams) stops moving."""
        ...

    async def upload(self, chunks: Iterator[UploadChunk], patience: float = 1.0,
                     ) -> UploadReply:
        """Stream ``chunks`` of one upload; the reply says how many bytes are held. With
        ``patience`` under 1, no progress for that share of the stall bound is
        ``NoProgress`` (the connection is left for ``exchange``)."""
        ...

    @property
    def can_take_over(self) -> bool:
        """Whether this connection may carry a transfer that made no progress on another."""
        ...

    def exchange(self, other: Self, why: str) -> None:
        """Swap connections with ``other`` after a transfer made no progress here."""
        ...

    async def upload_status(self, request: UploadStatusRequest) -> UploadReply:
        """How many bytes of an upload the coordinator holds."""
        ...


class ChunkSizer:
    """Chunk size for one direction of the link: halve after a failure, double after success.

    It stays within ``[minimum, maximum]`` and starts at ``start`` (clamped into the bounds).
    """

    def __init__(self, start: int, minimum: int = MIN_CHUNK_BYTES,
                 maximum: int = MAX_CHUNK_BYTES) -> None:
        require(minimum >= 1, "chunk.minimum", f"must be >= 1, got {minimum}")
        require(maximum >= minimum, "chunk.maximum", f"must be >= minimum={minimum}, "
                f"got {maximum}")
        self.minimum = minimum
        self.maximum = maximum
        self.size = min(max(start, minimum), maximum)

    @classmethod
    def for_server(cls, chunk_bytes: int) -> ChunkSizer:
        """A sizer starting at the coordinator's ``chunk_bytes`` and never going above it.

        A coordinator that names no chunk size (0) gets ``MAX_CHUNK_BYTES``.
        """
        maximum = min(MAX_CHUNK_BYTES, chunk_bytes) if chunk_bytes > 0 else MAX_CHUNK_BYTES
        return cls(maximum, minimum=min(MIN_CHUNK_BYTES, maximum), maximum=maximum)

    def failed(self) -> None:
        """A transfer attempt broke: use smaller chunks."""
        self.size = max(self.minimum, self.size // 2)

    def succeeded(self) -> None:
        """A transfer attempt went through cleanly: use larger chunks."""
        self.size = min(self.maximum, self.size * 2)


class LinkBreaks:
    """How many bytes the link carries between breaks, seen by transfers in both directions.

    Downloads and uploads share one link, and a link that broke under the model download will
    break under the upload too: every transfer reports the bytes it got through
    (``carried``) and each break (``broke``), and ``typical`` is a running mean of the bytes
    carried between breaks (the current run counts as soon as it is longer). ``None`` until
    the first break.
    """

    def __init__(self) -> None:
        self._run = 0  # bytes carried since the last break
        self._between: float | None = None

    def carried(self, nbytes: int) -> None:
        """``nbytes`` got through (a download chunk, or upload bytes the coordinator holds)."""
        self._run += nbytes

    def broke(self) -> None:
        """A transfer broke."""
        run, self._run = self._run, 0
        self._between = run if self._between is None else (self._between + run) / 2

    def typical(self) -> float | None:
        """Bytes the link usually carries between breaks; ``None`` if it never broke."""
        return None if self._between is None else max(self._between, self._run)


class SegmentSizer:
    """Bytes one ``Upload`` stream carries: like a TCP window, sized to the link's breaks.

    A break loses what the stream had handed to gRPC and the kernel beyond what the coordinator
    read (at most the segment, about half of it on average), so a segment should stay well
    under the bytes a link carries between breaks. The size is capped at a quarter of
    ``LinkBreaks.typical`` (breaks seen by downloads count too, so the first segment of an
    upload over a link that broke during the download is already small); below the cap it
    doubles after each clean segment and halves after a break. A link that never breaks lets
    it grow to ``maximum``: one round trip per segment, ever fewer.
    """

    def __init__(self, start: int = START_SEGMENT_BYTES, minimum: int = MIN_SEGMENT_BYTES,
                 maximum: int = MAX_SEGMENT_BYTES, breaks: LinkBreaks | None = None) -> None:
        require(1 <= minimum <= start <= maximum, "segment",
                f"need 1 <= minimum <= start <= maximum, got {minimum}, {start}, {maximum}")
        self.minimum = minimum
        self.maximum = maximum
        self.breaks = breaks if breaks is not None else LinkBreaks()
        self._size = start

    @property
    def size(self) -> int:
        """The bytes the next ``Upload`` stream may carry."""
        return max(self.minimum, min(self._size, self._cap()))

    def _cap(self) -> int:
        typical = self.breaks.typical()
        if typical is None:
            return self.maximum
        return min(self.maximum, max(self.minimum, int(typical / 4)))

    def succeeded(self, confirmed: int) -> None:
        """A segment went through; the coordinator confirmed ``confirmed`` more bytes."""
        self.breaks.carried(confirmed)
        self._size = min(self.size * 2, self._cap())

    def failed(self) -> None:
        """A segment broke."""
        self.breaks.broke()
        self._size = max(self.minimum, min(self.size // 2, self._cap()))


@dataclass(frozen=True)
class HeldModel:
    """The last model version a client downloaded, kept to receive the next one as a delta."""

    version: int
    vector: np.ndarray
    checksum: str


def model_checksum(vector: np.ndarray, encoding: str) -> str:
    """The checksum of ``vector`` as the coordinator serves it, encoded as ``encoding``.

    The broadcast codecs are deterministic and re-encode a vector they decoded to the same
    bytes (``fedlink.compress.broadcast_codec``).
    """
    return pack(vector, decoder_for(encoding)).header.checksum


def rebuilt_matches(model: np.ndarray, header: TensorHeader) -> bool:
    """Whether ``model`` (rebuilt from a delta) is the version ``header`` describes."""
    if header.values_checksum:
        return values_checksum(model) == header.values_checksum
    return model_checksum(model, header.encoding) == header.checksum


@dataclass
class Stripe:
    """One connection's share of a striped download: bytes ``[next, end)`` still due;
    ``whole``: taken over whole from another connection (``StripedPayload.steal``)."""

    next: int
    end: int
    whole: bool = False

    @property
    def left(self) -> int:
        """Bytes of the share not received yet."""
        return max(0, self.end - self.next)


class StripedPayload:
    """A payload of ``total`` bytes being downloaded in ``ways`` ranges at once: the bytes
    received so far (``buffer``) and the ranges still due (``stripes``). ``request`` holds
    what every range's ``DownloadRequest`` shares (client, task, delta)."""

    def __init__(self, total: int, ways: int, request: DownloadRequest) -> None:
        bounds = [total * i // ways for i in range(ways + 1)]
        self.stripes = [Stripe(a, b) for a, b in itertools.pairwise(bounds)]
        self.buffer = bytearray(total)
        self.request = request

    @property
    def left(self) -> int:
        """Bytes not received yet."""
        return sum(s.left for s in self.stripes)

    def steal(self, minimum: int = STRIPE_MIN_STEAL_BYTES) -> Stripe | None:
        """A range for an idle connection, which the range's connection gives up (it stops
        at the new ``end``): the upper half of the largest range left, or all of it when it
        is too small to split (under ``2 x minimum``), so that a connection deep in TCP
        backoff does not hold up the payload's last bytes. A range taken whole is not taken
        whole again: two moving connections would take it from each other for ever.
        ``None`` when nothing is left to take."""
        largest = max((s for s in self.stripes if s.left and not s.whole),
                      key=lambda s: s.left, default=None)
        if largest is None:
            return None
        whole = largest.left < 2 * minimum
        cut = largest.next if whole else largest.end - largest.left // 2
        taken = Stripe(cut, largest.end, whole=whole)
        largest.end = cut
        self.stripes.append(taken)
        return taken


class Transfers:
    """Resumable downloads and uploads over one link, retried by ``call``, counted in ``stats``.

    ``lanes``: gives more links to the same coordinator, each on a connection of its own
    (called when a download first needs them; none: no striping). A download of at least
    ``STRIPE_MIN_BYTES`` is striped over ``link`` and the lanes: each fetches a range, and one
    that finishes takes over half of what another has left (``StripedPayload.steal``), so a
    connection deep in TCP backoff holds up no more than its last range while the others
    carry the bytes. Uploads, whose coordinator holds a contiguous prefix, use ``link`` alone.
    """

    def __init__(self, link: TransferLink, call: Call, stats: SessionStats,
                 chunk_bytes: int,
                 lanes: Callable[[], tuple[TransferLink, ...]] | None = None) -> None:
        self.link = link
        self.lanes = lanes
        self.call = call
        self.stats = stats
        self.up = ChunkSizer.for_server(chunk_bytes)
        self.down = ChunkSizer.for_server(chunk_bytes)
        self.breaks = LinkBreaks()
        self.segment = SegmentSizer(breaks=self.breaks)

    # -- downloads ------------------------------------------------------------------------------

    async def fetch_model(self, client_id: str, task: Task, held: HeldModel | None) -> np.ndarray:
        """The task's model: the held one if it is that version, else a delta, else in full."""
        size = task.model.shape[0]
        if held is not None and held.checksum == task.model.checksum:
            self.stats.delta_bytes_saved += task.model.num_bytes
            return held.vector
        delta = task.delta_from(held.version) if held is not None else None
        if held is not None and delta is not None:
            model = await self._fetch_delta(client_id, task, delta, held)
            if model is not None:
                return model
        if task.model_data:
            data = self._received_inline(task.model_data)
        else:
            data = await self._download(client_id, task.task_id, task.model, delta=False)
        return unpack(task.model, data, size)

    def _received_inline(self, data: bytes) -> bytes:
        """A payload that came inside the ``Task`` (counted as downloaded)."""
        self.stats.bytes_down += len(data)
        return data

    async def _fetch_delta(self, client_id: str, task: Task, header: TensorHeader,
                           held: HeldModel) -> np.ndarray | None:
        """The model rebuilt from ``held`` and the task's delta; ``None`` if that fails."""
        try:
            if task.delta_data:
                data = self._received_inline(task.delta_data)
            else:
                data = await self._download(client_id, task.task_id, header, delta=True)
            if checksum(data) != header.checksum:
                raise DataLoss(f"delta checksum mismatch: header says {header.checksum!r}")
            model = apply_delta(held.vector, data)
            if not rebuilt_matches(model, task.model):
                raise DataLoss(f"model rebuilt from the delta does not match the model's "
                               f"checksum {task.model.values_checksum or task.model.checksum!r}")
        except RemoteError as exc:
            if exc.retryable:
                raise
            log.warning("delta download of task %s (version %d -> %d) failed: %s; "
                        "downloading the full model", task.task_id, held.version,
                        task.model_version, exc)
            return None
        self.stats.delta_bytes_saved += task.model.num_bytes - len(data)
        return model

    async def _download(self, client_id: str, task_id: str, header: TensorHeader,
                        delta: bool) -> bytes:
        """The payload ``header`` describes, resuming from the bytes held after a break;
        striped over the lanes when it is large enough.

        The length is checked here; the checksum by the caller (``unpack`` for a full model).
        """
        lanes = self.lanes() if self.lanes and header.num_bytes >= STRIPE_MIN_BYTES else ()
        payload = StripedPayload(header.num_bytes, 1 + len(lanes),
                                 DownloadRequest(client_id, task_id, delta=delta))
        if lanes:
            await self._fetch_striped(payload, (self.link, *lanes))
        else:
            await self._fetch_stripe(self.link, payload.stripes[0], payload)
        return bytes(payload.buffer)

    async def _fetch_striped(self, payload: StripedPayload,
                             links: tuple[TransferLink, ...]) -> None:
        """Fetch ``payload``'s ranges, one per link, each link going on with what the others
        have left (``_fetch_stripes``) until all of it has arrived.

        The streams share one ``Progress``: a stream stuck in TCP backoff is not stalled (and
        its connection not replaced) while another moves, it is overtaken. When the first
        link was overtaken, it takes the connection of one that finished
        (``TransferLink.exchange``), so that the calls after the download do not wait on it.
        """
        progress = Progress(RealClock().now)
        fetches = {asyncio.ensure_future(self._fetch_stripes(link, stripe, payload, progress)):
                   link for link, stripe in zip(links, list(payload.stripes), strict=True)}
        running = set(fetches)
        try:
            while payload.left:
                done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                # a connection that failed for good fails the download; every failure that
                # came in the same turn is taken, so none is left unretrieved
                failures = [error for error in (f.exception() for f in done) if error]
                if failures:
                    raise failures[0]
        finally:
            for fetch in running:
                fetch.cancel()  # the rest of the payload arrived over the other connections
            await asyncio.gather(*running, return_exceptions=True)
        finished = [fetches[f] for f in fetches if f not in running]
        if any(fetches[f] is self.link for f in running) and finished:
            self.link.exchange(finished[0], "a striped download overtook it")

    async def _fetch_stripes(self, link: TransferLink, stripe: Stripe,
                             payload: StripedPayload, progress: Progress) -> None:
        """Fetch ``stripe`` over ``link``, then take over part of another connection's share,
        until nothing is left to take (``StripedPayload.steal``)."""
        current: Stripe | None = stripe
        while current is not None:
            await self._fetch_stripe(link, current, payload, progress)
            current = payload.steal()
            self.stats.ranges_taken += current is not None

    async def _fetch_stripe(self, link: TransferLink, stripe: Stripe,
                            payload: StripedPayload, progress: Progress | None = None) -> None:
        """Fetch ``stripe`` over ``link`` under the retry policy, resuming where it broke."""
        request = payload.request
        what = "delta" if request.delta else "model"
        start = stripe.next

        async def attempt() -> None:
            if stripe.next > start:
                log.info("resumed %s download of task %s at offset %d of %d", what,
                         request.task_id, stripe.next, len(payload.buffer))
            # another connection may have taken the rest meanwhile; an empty payload is
            # still asked for (the answer may be that the task closed or the delta is gone)
            if stripe.left or not payload.buffer:
                await self._receive_stripe(link, dataclasses.replace(
                    request, offset=stripe.next, max_chunk_bytes=self.down.size,
                    end_offset=stripe.end if stripe.end < len(payload.buffer) else 0),
                    stripe, payload.buffer, progress)

        await self._call_while_moving(attempt, f"Download ({what})", lambda: stripe.next)

    async def _receive_stripe(self, link: TransferLink, request: DownloadRequest,
                              stripe: Stripe, buffer: bytearray,
                              progress: Progress | None) -> None:
        """Receive ``stripe`` over ``link`` until it ends. Its ``end`` may move down meanwhile
        (another connection took the rest), and a coordinator before protocol 1.1, which
        streams to the payload's end, is read only that far. A stream that ends before the
        range does is ``DataLoss``."""
        try:
            async with contextlib.aclosing(link.download(request, progress)) as chunks:
                async for chunk in chunks:
                    self._place(chunk, stripe, buffer)
                    if not stripe.left:
                        break
        except RemoteError as exc:
            if exc.retryable:
                self.down.failed()
                self.breaks.broke()
            raise
        if stripe.left:
            raise DataLoss(f"download of task {request.task_id} ended {stripe.left} bytes "
                           f"short of offset {stripe.end} of {len(buffer)}")
        self.down.succeeded()

    def _place(self, chunk: DataChunk, stripe: Stripe, buffer: bytearray) -> None:
        """Put what ``chunk`` brings of ``stripe`` into ``buffer``, counting all of it."""
        if chunk.offset != stripe.next or chunk.offset + len(chunk.data) > len(buffer):
            raise DataLoss(f"download chunk of {len(chunk.data)} bytes at offset "
                           f"{chunk.offset}, expected offset {stripe.next} of {len(buffer)}")
        piece = chunk.data[:stripe.left]
        buffer[stripe.next:stripe.next + len(piece)] = piece
        stripe.next += len(piece)
        self.stats.bytes_down += len(chunk.data)
        self.breaks.carried(len(chunk.data))

    # -- uploads --------------------------------------------------------------------------------

    async def upload(self, client_id: str, upload_id: str, data: bytes, resume: bool) -> None:
        """Send ``data`` as upload ``upload_id``, asking where to resume after any break.

        ``resume=False`` skips the status query on the first attempt (a fresh upload id holds
        nothing); an upload delivered from the outbox after a restart resumes from the start.
        A segment that makes no progress for ``HANDOVER_PATIENCE`` of the stall bound while
        another connection is open and fit (``_spare``) goes on over that one at once: the
        links swap connections (``TransferLink.exchange``) and the upload goes on from what
        the coordinator last confirmed, with no new connection and no retry.
        """
        attempts = 0
        held = 0

        async def attempt() -> None:
            nonlocal attempts, held
            attempts += 1
            if resume or attempts > 1:
                held = await self._held(client_id, upload_id, len(data))
            while held < len(data):
                spare = self._spare(len(data))
                try:
                    held = await self._send(client_id, upload_id, data, held,
                                            HANDOVER_PATIENCE if spare else 1.0)
                except NoProgress as exc:
                    # only a segment sent with a spare ends so; the next goes on from what
                    # the coordinator last confirmed (it drops what it holds already) over
                    # the spare's connection, without a status call that a connection as
                    # stuck would keep waiting for a whole deadline
                    assert spare is not None
                    self.link.exchange(spare, str(exc))

        await self._call_while_moving(attempt, "Upload", lambda: held)

    def _spare(self, size: int) -> TransferLink | None:
        """An open connection beside ``link`` fit to take an upload of ``size`` bytes over
        (one that makes striped downloads: ``lanes``), or ``None``."""
        if self.lanes is None or size < STRIPE_MIN_BYTES:
            return None
        return next((lane for lane in self.lanes() if lane.can_take_over), None)

    async def _call_while_moving(self, attempt: Callable[[], Awaitable[None]], what: str,
                                 position: Callable[[], int]) -> None:
        """``attempt`` under the retry policy, with a fresh policy each time it gives up after
        the transfer moved (``position``, the bytes held, grew): a big payload over a lossy
        link may break more often than one policy allows, and every break it survived moved
        it on; only a transfer that gets nowhere for a whole policy fails."""
        while True:
            start = position()
            try:
                await self.call(attempt, what, transfer=True)
                return
            except RemoteError as exc:
                if not exc.retryable or position() <= start:
                    raise
                self.stats.retries += 1  # the policy's last attempt is retried after all
                log.info("%s moved from %d to %d bytes before the retry policy gave up; "
                         "going on with a fresh one", what, start, position())

    async def _held(self, client_id: str, upload_id: str, total: int) -> int:
        status = await self.link.upload_status(UploadStatusRequest(client_id, upload_id))
        held = min(status.committed_offset, total)
        if held:
            self.stats.resumed_bytes += held
            log.info("resumed upload %s at offset %d of %d", upload_id, held, total)
        return held

    async def _send(self, client_id: str, upload_id: str, data: bytes, start: int,
                    patience: float = 1.0) -> int:
        """Send one segment of ``data`` from ``start`` in one stream; returns the bytes held
        (``patience``: see ``TransferLink.upload``).

        A stream carries at most ``self.segment.size`` bytes: gRPC and the kernel take a
        stream's messages into their buffers far ahead of what the coordinator has read, and a
        reset loses all of that, so bounding the segment bounds what a break wastes
        (``SegmentSizer``). Chunks are at most a quarter of the segment, so that a break in the
        middle of one loses little too.
        """
        end = min(len(data), start + self.segment.size)
        try:
            reply = await self.link.upload(self._chunks(client_id, upload_id, data, start, end),
                                           patience)
        except RemoteError as exc:
            if exc.retryable:
                self.up.failed()
                self.segment.failed()
            raise
        held = min(reply.committed_offset, len(data))
        if held <= start:
            raise DataLoss(f"upload {upload_id} made no progress: the coordinator holds {held} "
                           f"bytes after a segment sent from offset {start}")
        self.up.succeeded()
        self.segment.succeeded(held - start)
        return held

    def _chunks(self, client_id: str, upload_id: str, data: bytes, start: int,
                end: int) -> Iterator[UploadChunk]:
        """The upload's chunks in ``[start, end)``, made one at a time as the stream wants them."""
        size = min(self.up.size, max(self.up.minimum, self.segment.size // 4))
        # the first chunk is small: the coordinator knows whose stream it is only from a
        # chunk, and counts an open stream as a sign of life (a lossy uplink may take half a
        # minute to carry a whole chunk, while heartbeats queue behind it)
        step = min(size, FIRST_CHUNK_BYTES)
        view = memoryview(data)
        offset = start
        while offset < end:
            piece = bytes(view[offset:min(offset + step, end)])
            self.stats.bytes_up += len(piece)
            yield UploadChunk(client_id, upload_id, offset, piece)
            offset, step = offset + len(piece), size
