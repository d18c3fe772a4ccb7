"""Identities from rotated addresses and re-joined ids, against a coordinator's default limits.

Two attacks on an unauthenticated coordinator (``CoordinatorConfig()``, in this process, on
loopback), each beside what an honest client gets in the same run:

- **rotated addresses**: ``ROTATED`` (12) loopback source addresses send ``JOINS`` Joins
  (10,200, past ``max_clients``; 2,400 with ``--quick``) under fresh names, one relay per
  address binding its upstream connection to that address. ``flood_ids_registered`` is how
  many ids they got, ``flood_seconds`` how long the flood took, ``flood_share_of_max_clients``
  the registry's fill; then an honest client from a thirteenth address joins, following retry
  hints as the SDK does: ``honest_join_ok`` (1 or 0) and ``honest_join_attempts``.
- **re-joined ids**: for ``WINDOW_S`` seconds (3; 1 with ``--quick``) a client heartbeats as
  fast as it can and, each time it is refused, joins again under its name and carries on; an
  honest client beside it, on its own connection, heartbeats as fast without re-joining.
  ``rejoin_heartbeats_answered`` against ``honest_heartbeats_answered``, and their ratio
  ``rejoin_over_honest`` (1.0: joining again buys nothing).

Timings come from whatever machine runs it (the flood's figures depend on its speed).

Run: ``python benchmarks/identity_budgets.py [--quick] [--json FILE]``
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import parse_args, report

from fedlink.coordinator import CoordinatorConfig, CoordinatorServer
from fedlink.metrics import EventLog
from fedlink.proto.v1 import coordinator_pb2 as pb
from fedlink.proto.v1 import coordinator_pb2_grpc as pb_grpc
from fedlink.wire.status import retry_delay

ROTATED = [f"127.0.0.{i}" for i in range(2, 14)]
HONEST = "127.0.0.99"
JOINS, QUICK_JOINS = 10_200, 2_400
WINDOW_S, QUICK_WINDOW_S = 3.0, 1.0
TIMEOUT_S = 10.0


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, asyncio.CancelledError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    with contextlib.suppress(ConnectionError, RuntimeError):
        writer.close()


@contextlib.asynccontextmanager
async def from_address(source: str, port: int) -> AsyncIterator[pb_grpc.CoordinatorStub]:
    """A stub whose connections reach the coordinator on ``port`` from address ``source``."""
    pipes: set[asyncio.Task[None]] = set()

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port,
                                                             local_addr=(source, 0))
        for task in (_pipe(reader, up_writer), _pipe(up_reader, writer)):
            pipes.add(asyncio.create_task(task))

    server = await asyncio.start_server(relay, "127.0.0.1", 0)
    try:
        target = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        async with grpc.aio.insecure_channel(target) as channel:
            yield pb_grpc.CoordinatorStub(channel)
    finally:
        server.close()
        for task in pipes:
            task.cancel()
        await asyncio.gather(*pipes, return_exceptions=True)


async def join(stub: pb_grpc.CoordinatorStub, name: str) -> tuple[str, str, float | None]:
    """``(status, client id, retry hint)`` of one ``Join``."""
    try:
        reply = await stub.Join(pb.JoinRequest(client_name=name, num_examples=10),
                                timeout=TIMEOUT_S)
    except grpc.aio.AioRpcError as err:
        return err.code().name, "", retry_delay(err)
    return "OK", reply.client_id, None


async def flood_from(port: int, source: str, joins: int) -> int:
    """Fresh-name Joins from ``source``, 20 at a time; how many got an id."""
    async with from_address(source, port) as stub:
        ok = 0
        for start in range(0, joins, 20):
            batch = [join(stub, f"sybil-{source}-{start + i}")
                     for i in range(min(20, joins - start))]
            ok += sum(code == "OK" for code, _, _ in await asyncio.gather(*batch))
        return ok


async def rotated(joins: int) -> dict[str, Any]:
    config = CoordinatorConfig()
    async with CoordinatorServer(config, np.zeros(8, np.float32), EventLog(None)) as server:
        started = time.monotonic()
        got = await asyncio.gather(*(flood_from(server.port, source, joins // len(ROTATED))
                                     for source in ROTATED))
        seconds = time.monotonic() - started
        attempts, code, hint = 0, "", None
        async with from_address(HONEST, server.port) as stub:
            while attempts < 10 and (attempts == 0 or code == "RESOURCE_EXHAUSTED"):
                if hint is not None:
                    await asyncio.sleep(hint)  # the coordinator's own hint, as the SDK waits
                code, _, hint = await join(stub, "honest")
                attempts += 1
        return {"flood_joins_sent": joins // len(ROTATED) * len(ROTATED),
                "flood_ids_registered": sum(got), "flood_seconds": seconds,
                "flood_share_of_max_clients": sum(got) / config.limits.max_clients,
                "honest_join_ok": int(code == "OK"), "honest_join_attempts": attempts}


async def heartbeats(port: int, name: str, rejoin: bool, window_s: float) -> int:
    """Heartbeats answered in ``window_s`` seconds of calls (re-joining when refused, if
    ``rejoin``)."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        return await _beat(pb_grpc.CoordinatorStub(channel), name, rejoin, window_s)


async def _beat(stub: pb_grpc.CoordinatorStub, name: str, rejoin: bool, window_s: float) -> int:
    _, client_id, _ = await join(stub, name)
    answered = 0
    ends = time.monotonic() + window_s
    while time.monotonic() < ends:
        try:
            await stub.Heartbeat(pb.HeartbeatRequest(client_id=client_id), timeout=TIMEOUT_S)
            answered += 1
        except grpc.aio.AioRpcError as err:
            if rejoin and err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                code, fresh, _ = await join(stub, name)
                client_id = fresh if code == "OK" else client_id
    return answered


async def rejoined(window_s: float) -> dict[str, Any]:
    async with CoordinatorServer(CoordinatorConfig(), np.zeros(8, np.float32),
                                 EventLog(None)) as server:
        honest, greedy = await asyncio.gather(
            heartbeats(server.port, "honest", False, window_s),
            heartbeats(server.port, "greedy", True, window_s))
    return {"honest_heartbeats_answered": honest, "rejoin_heartbeats_answered": greedy,
            "rejoin_over_honest": greedy / max(1, honest)}


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    figures = asyncio.run(rotated(QUICK_JOINS if args.quick else JOINS))
    figures |= asyncio.run(rejoined(QUICK_WINDOW_S if args.quick else WINDOW_S))
    report(figures, args.json)


if __name__ == "__main__":
    main()
