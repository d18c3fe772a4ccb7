"""Time to deliver an update over emulated links: resumable uploads against restart-from-scratch.

Each run uploads one update (1, 4 and 16 MB; ``--quick``: 1 and 4 MB) to a real coordinator on
loopback through a ``TcpProxy`` carrying a preset link (``4g``: 8 Mbit/s up, 30 ms one-way;
``wifi-good``: 20 Mbit/s up, 10 ms), clean or with connection resets. Two ways to deliver:

- **resumable**: the SDK's own transfers (``fedlink.client.transfer.Transfers.upload``): after a
  break it asks ``UploadStatus`` where to go on, with adaptive chunks and segments;
- **restart** (the baseline, same run, same links, same reset draws): a raw upload loop that
  streams the whole update in 1 MiB chunks and, after every break, starts over from byte 0
  under a fresh upload id (what a client without resumable uploads does).

Both retry with the same fast backoff. With resets, the link resets about every *half an
update* (``reset_every_kb`` = size / 2, exponential draws counted on bytes delivered both
ways): the restart baseline then needs about ``e^2 - 1 = 6.4`` half-updates per delivery on
average, the resumable one a little over one update. The connection is set up before the
clock starts; the time is that of the upload call (status queries and retries included).

Figures, per link, size and case: ``<link>_<size>mb_<clean|resets>_<resumable|restart>_s``
(seconds), ``..._sent_ratio`` (bytes handed to gRPC / update size), and:

- ``goodput_fraction_clean``: achieved / link bandwidth, no resets, resumable, for the largest
  size run, the lowest over the links (target >= 0.85);
- ``resume_speedup_16mb``: restart time / resumable time with resets, 16 MB, the lowest over
  the links (target >= 2); in ``--quick`` mode it is computed for the largest size run (4 MB)
  and ``resume_speedup_size_mb`` says so.

A restart run that has not delivered after ``RESTART_CAP`` x the resumable time stops; its time
is then a lower bound (``..._restart_capped`` = 1).

Run: ``python benchmarks/resumable_upload.py [--quick] [--json FILE]``
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import parse_args, report

from fedlink.client import RetryPolicy, SessionStats, Transport
from fedlink.client.retry import Caller
from fedlink.client.transfer import Transfers
from fedlink.coordinator import CoordinatorConfig, CoordinatorServer, FlushRule, LimitsConfig
from fedlink.errors import RemoteError
from fedlink.messages import JoinRequest, UploadChunk, UploadStatusRequest
from fedlink.metrics import EventLog
from fedlink.netem.presets import preset
from fedlink.netem.profile import LinkProfile
from fedlink.netem.proxy import TcpProxy

MB = 1_000_000
CHUNK = 1 << 20
LINKS = ("4g", "wifi-good")
RETRY = RetryPolicy(initial_backoff_s=0.02, max_backoff_s=0.2, max_attempts=10_000,
                    budget_s=3600.0)
RESTART_CAP = 10.0
SEED = 7


@dataclass(frozen=True)
class Outcome:
    """One delivery: seconds, bytes handed to gRPC, and whether it was stopped at the cap."""

    seconds: float
    sent: int
    capped: bool = False


async def resumable(address: str, client_id: str, data: bytes) -> Outcome:
    """The SDK's resumable upload."""
    async with Transport(address) as transport:
        stats = SessionStats()
        transfers = Transfers(transport, Caller(RETRY, stats), stats, CHUNK)
        await _connect(transport, client_id)
        started = time.perf_counter()
        await transfers.upload(client_id, f"r-{uuid.uuid4().hex}", data, resume=False)
        return Outcome(time.perf_counter() - started, stats.bytes_up)


async def restart(address: str, client_id: str, data: bytes, cap_s: float) -> Outcome:
    """The baseline: the whole update in one stream; after a break, from 0 under a new id."""
    async with Transport(address) as transport:
        await _connect(transport, client_id)
        sent = 0
        started = time.perf_counter()

        def chunks(upload_id: str) -> Iterator[UploadChunk]:
            nonlocal sent
            for offset in range(0, len(data), CHUNK):
                piece = data[offset:offset + CHUNK]
                sent += len(piece)
                yield UploadChunk(client_id, upload_id, offset, piece)

        async def attempt() -> None:
            if time.perf_counter() - started > cap_s:
                raise TimeoutError
            reply = await transport.upload(chunks(f"s-{uuid.uuid4().hex}"))
            if reply.committed_offset != len(data):
                raise RuntimeError(f"upload ended at {reply.committed_offset} of {len(data)}")

        try:
            await Caller(RETRY, SessionStats())(attempt, "restart upload")
        except TimeoutError:
            return Outcome(time.perf_counter() - started, sent, capped=True)
        return Outcome(time.perf_counter() - started, sent)


async def _connect(transport: Transport, client_id: str) -> None:
    """Make one cheap call so the channel is connected before timing starts."""
    for _ in range(100):
        try:
            await transport.upload_status(UploadStatusRequest(client_id, "warm-up"))
            return
        except RemoteError:
            await asyncio.sleep(0.02)


def _limits(largest: int) -> LimitsConfig:
    """Limits that let raw uploads of ``largest`` bytes through: the defaults derive the
    update bound from the model's size (4 parameters here), and the restart baseline leaves
    its abandoned partial uploads behind, each holding bytes until it idles out."""
    held = 64 * largest
    return LimitsConfig(liveness_timeout_s=0, max_update_bytes=largest + MB,
                        max_upload_bytes_per_client=held, max_spool_bytes=held,
                        max_open_uploads_per_client=1000)


async def measure(quick: bool) -> dict[str, object]:
    sizes = (1, 4) if quick else (1, 4, 16)
    config = CoordinatorConfig(rounds=1, flush=FlushRule(goal=1, deadline_s=None),
                               limits=_limits(max(sizes) * MB))
    figures: dict[str, object] = {"quick": quick, "seed": SEED}
    goodput: list[float] = []
    speedups: list[float] = []
    server = CoordinatorServer(config, np.zeros(4, np.float32), EventLog(None),
                               address="127.0.0.1:0")
    async with server:
        upstream = f"127.0.0.1:{server.port}"
        async with Transport(upstream) as direct:
            client_id = (await direct.join(JoinRequest(client_name="bench"))).client_id
        for link in LINKS:
            base = preset(link)
            bandwidth = (base.up_kbps or 0) * 1000 / 8  # bytes per second
            for size in sizes:
                data = np.random.default_rng(size).bytes(size * MB)
                resets = base.replace(name=f"{link}-resets", reset_every_kb=size * 1000 / 2,
                                      seed=SEED)
                for case, profile in (("clean", base.with_seed(SEED)), ("resets", resets)):
                    key = f"{link}_{size}mb_{case}"
                    fast = await _through(profile, upstream,
                                          partial(resumable, client_id=client_id, data=data))
                    slow = await _through(profile, upstream, partial(
                        restart, client_id=client_id, data=data,
                        cap_s=RESTART_CAP * fast.seconds))
                    figures[f"{key}_resumable_s"] = fast.seconds
                    figures[f"{key}_restart_s"] = slow.seconds
                    figures[f"{key}_resumable_sent_ratio"] = fast.sent / len(data)
                    figures[f"{key}_restart_sent_ratio"] = slow.sent / len(data)
                    figures[f"{key}_restart_capped"] = int(slow.capped)
                    figures[f"{key}_speedup"] = slow.seconds / fast.seconds
                    if case == "clean":
                        fraction = len(data) / fast.seconds / bandwidth
                        figures[f"{key}_goodput_fraction"] = fraction
                        if size == sizes[-1]:
                            goodput.append(fraction)
                    elif size == sizes[-1]:
                        speedups.append(slow.seconds / fast.seconds)
                    print(f"{key}: resumable {fast.seconds:.2f} s "
                          f"(sent {fast.sent / len(data):.2f}x), restart {slow.seconds:.2f} s "
                          f"(sent {slow.sent / len(data):.2f}x"
                          f"{', capped' if slow.capped else ''})", flush=True)
    figures["goodput_fraction_clean"] = min(goodput)
    figures["resume_speedup_16mb"] = min(speedups)
    figures["resume_speedup_size_mb"] = sizes[-1]
    return figures


async def _through(profile: LinkProfile, upstream: str,
                   run: Callable[[str], Awaitable[Outcome]]) -> Outcome:
    """Run ``run(address)`` through a fresh proxy carrying ``profile``."""
    async with TcpProxy(profile, upstream) as proxy:
        return await run(proxy.address)


def main() -> None:
    """Measure, then print the figures (and write them as JSON when asked)."""
    args = parse_args(__doc__.splitlines()[0])
    started = time.perf_counter()
    figures = asyncio.run(measure(args.quick))
    figures["benchmark_seconds"] = time.perf_counter() - started
    report(figures, args.json)


if __name__ == "__main__":
    main()
