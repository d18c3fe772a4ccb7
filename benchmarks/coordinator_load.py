"""Coordinator under load: many connected lightweight clients heartbeating and committing.

One coordinator runs as its own process (this file re-run with ``--serve``) on loopback, in
FedBuff mode (continuous, every client may hold a task, ``goal`` updates per flush) with a
small model. The load comes from this process: ``grpc.aio``, one channel (one HTTP/2
connection) per client, so every client is a separately connected peer, all on one event loop.

Each client joins, then cycles until the measuring window ends: ``GetTask`` (no long poll),
when given a task ``Upload`` + ``Commit`` of a small fp32 update, then ``Heartbeat``, then a
pause of ``period_s`` (jittered). Every call's latency is recorded; any failed call counts as
a failure (overload refusals included).

Figures: ``clients``, ``failures``, ``calls``, ``calls_per_s``, ``p50_ms``, ``p99_ms`` (over
every call), ``updates_per_s`` (accepted commits per second), ``flushes``.
Targets: zero failures; ``p99_ms`` <= 250 at 500 clients.

The same load then runs against a crash-safe coordinator (``state_dir`` in a temporary folder:
SQLite journal committed with fsync before each call answers, spooled uploads, a checkpoint
per flush): ``durable_failures``, ``durable_p50_ms``, ``durable_p99_ms``,
``durable_updates_per_s``, and ``durable_p99_ratio`` (durable p99 / in-memory p99, the cost of
crash safety).

Usage: ``python benchmarks/coordinator_load.py [--quick] [--json FILE]`` (``--quick``: 100
clients for 10 s; the full run: 500 clients for 30 s).
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import parse_args, report

from fedlink.compress import get_codec
from fedlink.messages import CommitRequest
from fedlink.proto.v1 import coordinator_pb2 as pb
from fedlink.proto.v1 import coordinator_pb2_grpc as pb_grpc
from fedlink.wire import pack, to_proto

DIM = 256  # a 1 KiB fp32 update
GOAL = 50
PERIOD_S = 2.0
CALL_TIMEOUT_S = 10.0


def serve(state_dir: str = "") -> None:
    """The coordinator process: prints ``PORT <n>`` once listening, serves until killed."""
    from fedlink.coordinator import CoordinatorConfig, CoordinatorServer, FlushRule
    from fedlink.coordinator.config import LimitsConfig
    from fedlink.metrics import EventLog

    config = CoordinatorConfig(
        rounds=10**9,
        flush=FlushRule(goal=GOAL, continuous=True, deadline_s=None, max_staleness=10**6,
                        over_selection=1000 / GOAL),
        limits=LimitsConfig(long_poll_s=0.0, retry_after_s=0.5, liveness_timeout_s=0,
                            max_clients=10_000),
        state_dir=state_dir)

    async def main() -> None:
        server = CoordinatorServer(config, np.zeros(DIM, np.float32), EventLog(None),
                                   address="127.0.0.1:0")
        port = await server.start()
        print(f"PORT {port}", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


@dataclass
class Load:
    """What the clients measured."""

    latencies_ms: list[float] = field(default_factory=list)
    failures: int = 0
    accepted: int = 0
    errors: dict[str, int] = field(default_factory=dict)

    def fail(self, exc: BaseException) -> None:
        self.failures += 1
        name = exc.code().name if isinstance(exc, grpc.aio.AioRpcError) else type(exc).__name__
        self.errors[name] = self.errors.get(name, 0) + 1


async def timed(load: Load, measuring: bool, call: object) -> object:
    started = time.perf_counter()
    result = await call  # type: ignore[misc]
    if measuring:
        load.latencies_ms.append((time.perf_counter() - started) * 1000)
    return result


async def client(index: int, target: str, start_at: float, stop_at: float, load: Load) -> None:
    rng = random.Random(index)
    update = pack(np.full(DIM, 1e-3, np.float32), get_codec("fp32"))
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.CoordinatorStub(channel)
        try:
            joined = await stub.Join(pb.JoinRequest(client_name=f"load-{index}",
                                                    num_examples=10), timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            load.fail(exc)
            return
        client_id, uploads = joined.client_id, 0
        await asyncio.sleep(max(0.0, start_at - time.monotonic()) + rng.uniform(0, PERIOD_S))
        while time.monotonic() < stop_at:
            measuring = time.monotonic() >= start_at
            try:
                reply = await timed(load, measuring, stub.GetTask(
                    pb.GetTaskRequest(client_id=client_id, held_version=-1),
                    timeout=CALL_TIMEOUT_S))
                task_id = ""
                if reply.WhichOneof("outcome") == "task":  # type: ignore[attr-defined]
                    task = reply.task  # type: ignore[attr-defined]
                    task_id, uploads = task.task_id, uploads + 1
                    upload_id = f"{client_id}-u{uploads}"
                    chunk = pb.UploadChunk(client_id=client_id, upload_id=upload_id, offset=0,
                                           data=update.data)
                    await timed(load, measuring, stub.Upload(iter([chunk]),
                                                             timeout=CALL_TIMEOUT_S))
                    await timed(load, measuring, stub.Commit(to_proto(CommitRequest(
                        client_id=client_id, upload_id=upload_id, task_id=task_id,
                        base_version=task.model_version, num_examples=10, steps_completed=1,
                        steps_planned=1, update=update.header)), timeout=CALL_TIMEOUT_S))
                    if measuring:
                        load.accepted += 1
                await timed(load, measuring, stub.Heartbeat(
                    pb.HeartbeatRequest(client_id=client_id, task_id=task_id),
                    timeout=CALL_TIMEOUT_S))
            except grpc.aio.AioRpcError as exc:
                load.fail(exc)
            await asyncio.sleep(PERIOD_S * rng.uniform(0.5, 1.5))


async def drive(target: str, clients: int, warmup_s: float, seconds: float) -> Load:
    load = Load()
    start_at = time.monotonic() + warmup_s
    stop_at = start_at + seconds
    await asyncio.gather(*(client(i, target, start_at, stop_at, load)
                           for i in range(clients)))
    return load


def main() -> None:
    if sys.argv[1:2] == ["--serve"]:
        serve(*sys.argv[2:3])
        return
    args = parse_args(__doc__.splitlines()[0])
    clients, seconds = (100, 10.0) if args.quick else (500, 30.0)
    load = measure(clients, seconds)
    with tempfile.TemporaryDirectory(prefix="fedlink-load-") as state_dir:
        durable = measure(clients, seconds, state_dir)
    latencies = np.asarray(load.latencies_ms or [float("nan")])
    durable_latencies = np.asarray(durable.latencies_ms or [float("nan")])
    figures = {
        "clients": clients,
        "seconds": seconds,
        "failures": load.failures,
        "calls": len(load.latencies_ms),
        "calls_per_s": round(len(load.latencies_ms) / seconds, 1),
        "p50_ms": round(float(np.percentile(latencies, 50)), 2),
        "p99_ms": round(float(np.percentile(latencies, 99)), 2),
        "updates_per_s": round(load.accepted / seconds, 1),
        "load_processes": 1,
        "channels": clients,
        "durable_failures": durable.failures,
        "durable_p50_ms": round(float(np.percentile(durable_latencies, 50)), 2),
        "durable_p99_ms": round(float(np.percentile(durable_latencies, 99)), 2),
        "durable_updates_per_s": round(durable.accepted / seconds, 1),
    }
    figures["durable_p99_ratio"] = round(figures["durable_p99_ms"] / figures["p99_ms"], 2)
    for name, measured in (("in memory", load), ("durable", durable)):
        if measured.errors:
            print(f"errors ({name}):", measured.errors)
    report(figures, args.json)


def measure(clients: int, seconds: float, state_dir: str = "") -> Load:
    """Start a coordinator process (durable with ``state_dir``) and drive the load at it."""
    server = subprocess.Popen([sys.executable, __file__, "--serve", state_dir],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        if not line.startswith("PORT "):
            raise SystemExit(f"the coordinator did not start: {line!r}")
        target = f"127.0.0.1:{int(line.split()[1])}"
        return asyncio.run(drive(target, clients, warmup_s=PERIOD_S, seconds=seconds))
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()
