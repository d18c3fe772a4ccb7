"""The coordinator's edge under hostile load: memory held by messages in flight, and a stop.

**Memory in flight.** A coordinator process (default config, run in a child process so its
RSS is its own) receives 200 concurrent ``Join`` calls (``--quick``: 100) on 2 HTTP/2
connections, then 8 concurrent ``Upload`` streams of one 3 MiB chunk (the largest accepted)
whose commits are refused. Two attacks, each on a fresh coordinator: ``attack``, Joins of
about 7.9 MiB each, the hostile-clients review's (+1,073 MiB before the edge bounded bytes in
flight), and ``cap``, Joins just under the message cap (the largest a coordinator still
reads). Figures per attack: ``inflight_<attack>_rss_growth_mb`` (the coordinator's peak RSS,
VmHWM, above its RSS once listening), ``inflight_<attack>_rss_held_mb`` (RSS left after it),
``inflight_<attack>_refused`` (calls answered ``RESOURCE_EXHAUSTED``);
``inflight_rss_growth_mb``, the larger growth (target <= 100); and the baseline
``inflight_clean_rss_growth_mb``: the same coordinator's growth for as many ordinary Joins in
the same run, with ``inflight_growth_vs_clean`` the ratio.

**Stop.** ``fedlink serve`` with a client connected that heartbeats every 0.2 s and an upload
stream held open: ``sigterm_drain_seconds`` from SIGTERM to the process's exit (target <= 10;
the default ``drain_s`` is 5), and ``sigterm_record_seconds`` from SIGTERM until
``summary.json`` and the model were on disk.

Timings on a loaded machine are noisy; the RSS figures are not timings.

Run: ``python benchmarks/edge_limits.py [--quick] [--json FILE]``
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).parent))
from _common import parse_args, report

from fedlink.proto.v1 import coordinator_pb2 as pb
from fedlink.proto.v1 import coordinator_pb2_grpc as pb_grpc

JOIN_BYTES = int(7.9 * (1 << 20))
CAP_JOIN_BYTES = (3 << 20) + (32 << 10)
"""Just under the default message cap (``max_chunk_bytes`` 3 MiB + 64 KiB): the largest Join
the coordinator still reads."""
LISTENING = re.compile(r"listening on ([\d.]+):(\d+)")

SERVER = """
import asyncio, sys
import numpy as np
from fedlink.coordinator import CoordinatorConfig, CoordinatorServer
from fedlink.metrics import EventLog

async def main():
    with EventLog(None) as events:
        async with CoordinatorServer(CoordinatorConfig(), np.zeros(1000, np.float32),
                                     events) as server:
            print(f"listening on 127.0.0.1:{server.port}", flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

asyncio.run(main())
"""


def memory_mb(pid: int) -> tuple[float, float]:
    """``(VmRSS, VmHWM)`` of process ``pid`` in MiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text()
                  .splitlines() if ":" in line)
    return (int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024)


def reset_peak(pid: int) -> None:
    """Reset the peak RSS (VmHWM) of ``pid`` to its current RSS (Linux >= 4.0)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def start(argv: list[str], stdin: int | None = None,
          env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    """Start ``argv``; the process and its ``HOST:PORT`` once it listens."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=stdin, text=True, env=env)
    assert proc.stdout is not None
    for line in proc.stdout:
        match = LISTENING.search(line)
        if match:  # keep reading its output, or a full pipe would stall it
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            return proc, f"{match[1]}:{match[2]}"
    raise RuntimeError(f"{argv} exited without listening (status {proc.wait()})")


def channels(address: str, count: int) -> list[grpc.aio.Channel]:
    """``count`` channels to ``address``, each on a connection of its own."""
    return [grpc.aio.insecure_channel(address, options=[
        ("grpc.max_send_message_length", 64 << 20), ("fedlink.bench_connection", i)])
        for i in range(count)]


async def flood_joins(address: str, calls: int, size: int) -> int:
    """``calls`` concurrent Joins carrying ``size`` bytes each, on 2 connections; refusals."""
    open_channels = channels(address, 2)
    stubs = [pb_grpc.CoordinatorStub(c) for c in open_channels]
    request = pb.JoinRequest(client_name="x", num_examples=10,
                             metadata={"pad": "x" * size} if size else {})

    async def one(i: int) -> bool:
        try:
            await stubs[i % 2].Join(request, timeout=120)
        except grpc.aio.AioRpcError as err:
            return err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        return False

    refused = sum(await asyncio.gather(*(one(i) for i in range(calls))))
    for channel in open_channels:
        await channel.close()
    return refused


async def refused_uploads(address: str, streams: int) -> int:
    """``streams`` Uploads of one near-maximal chunk each, committed against no task."""
    (channel,) = channels(address, 1)
    stub = pb_grpc.CoordinatorStub(channel)
    refused = 0
    joined = await stub.Join(pb.JoinRequest(client_name="u", num_examples=10), timeout=60)
    data = b"\x01" * (3 << 20)  # max_chunk_bytes: the largest chunk accepted

    async def one(i: int) -> None:
        nonlocal refused
        chunk = pb.UploadChunk(client_id=joined.client_id, upload_id=f"u{i}", offset=0,
                               data=data)
        try:
            await stub.Upload(iter([chunk]), timeout=60)
            await stub.Commit(pb.CommitRequest(client_id=joined.client_id, upload_id=f"u{i}",
                                               task_id="t0-v0"), timeout=60)
        except grpc.aio.AioRpcError:
            refused += 1

    await asyncio.gather(*(one(i) for i in range(streams)))
    await channel.close()
    return refused


def measure_inflight(quick: bool) -> dict[str, Any]:
    """The memory figures (see the module docstring)."""
    calls = 100 if quick else 200
    with tempfile.TemporaryDirectory() as scratch:
        script = Path(scratch) / "server.py"
        script.write_text(textwrap.dedent(SERVER))
        figures: dict[str, Any] = {}
        for name, size in (("clean", 0), ("attack", JOIN_BYTES), ("cap", CAP_JOIN_BYTES)):
            proc, address = start([sys.executable, str(script)], stdin=subprocess.PIPE)
            try:
                time.sleep(1.0)  # let start-up allocations settle
                reset_peak(proc.pid)
                before, _ = memory_mb(proc.pid)
                refused = asyncio.run(flood_joins(address, calls, size))
                if size:
                    refused += asyncio.run(refused_uploads(address, 8))
                after, peak = memory_mb(proc.pid)
            finally:
                proc.kill()
                proc.wait()
            if size:
                figures.update({f"inflight_{name}_rss_growth_mb": round(peak - before, 1),
                                f"inflight_{name}_rss_held_mb": round(after - before, 1),
                                f"inflight_{name}_refused": refused})
            else:
                figures["inflight_clean_rss_growth_mb"] = round(peak - before, 1)
    figures["inflight_rss_growth_mb"] = max(figures["inflight_attack_rss_growth_mb"],
                                            figures["inflight_cap_rss_growth_mb"])
    figures["inflight_growth_vs_clean"] = round(
        figures["inflight_rss_growth_mb"] / max(1.0, figures["inflight_clean_rss_growth_mb"]), 2)
    return figures


STOP_CONFIG = """
[run]
name = "stop"
[data]
dataset = "digits"
clients = 2
[model]
name = "logreg"
[coordinator]
rounds = 100
[coordinator.flush]
goal = 2
deadline_s = 0.0
"""


async def heartbeat_through_stop(address: str, stopped: asyncio.Event,
                                 ready: asyncio.Event) -> None:
    """A client with a task that heartbeats every 0.2 s, and an upload stream left open."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.CoordinatorStub(channel)
        joined = await stub.Join(pb.JoinRequest(client_name="h", num_examples=10), timeout=60)
        reply = await stub.GetTask(pb.GetTaskRequest(client_id=joined.client_id,
                                                     held_version=-1), timeout=60)
        release = asyncio.Event()

        async def chunks() -> AsyncIterator[pb.UploadChunk]:
            yield pb.UploadChunk(client_id=joined.client_id, upload_id="open", offset=0,
                                 data=b"\x01" * 1024)
            await release.wait()

        upload = stub.Upload(chunks(), timeout=120)
        ready.set()
        while not stopped.is_set():
            # told to come back, or gone: keep heartbeating like a client would
            with contextlib.suppress(grpc.aio.AioRpcError):
                await stub.Heartbeat(pb.HeartbeatRequest(client_id=joined.client_id,
                                                         task_id=reply.task.task_id), timeout=5)
            await asyncio.sleep(0.2)
        release.set()
        upload.cancel()


def measure_stop() -> dict[str, Any]:
    """The stop figures (see the module docstring)."""
    with tempfile.TemporaryDirectory() as scratch:
        config = Path(scratch) / "stop.toml"
        config.write_text(textwrap.dedent(STOP_CONFIG))
        run_dir = Path(scratch) / "runs" / "stop"
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        proc, address = start([sys.executable, "-m", "fedlink", "serve", "--config",
                               str(config), "--host", "127.0.0.1", "--port", "0",
                               "--output-dir", str(run_dir.parent)], env=env)

        async def scenario() -> tuple[float, float]:
            stopped, ready = asyncio.Event(), asyncio.Event()
            client = asyncio.ensure_future(heartbeat_through_stop(address, stopped, ready))
            await ready.wait()
            await asyncio.sleep(1.0)  # a few heartbeats in
            signalled = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            recorded = None
            while proc.poll() is None:
                if recorded is None and (run_dir / "model.npy").exists():
                    recorded = time.monotonic() - signalled
                await asyncio.sleep(0.01)
            drained = time.monotonic() - signalled
            stopped.set()
            await client
            return drained, recorded if recorded is not None else drained

        try:
            drained, recorded = asyncio.run(scenario())
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        recorded_ok = (run_dir / "summary.json").exists() and (run_dir / "model.npy").exists()
    return {"sigterm_drain_seconds": round(drained, 2),
            "sigterm_record_seconds": round(recorded, 2),
            "sigterm_left_record": int(recorded_ok)}


def main() -> None:
    """Measure and print the figures."""
    args = parse_args(__doc__.splitlines()[0], parts=("inflight", "stop"))
    figures: dict[str, Any] = {}
    if args.only in (None, "inflight"):
        figures.update(measure_inflight(args.quick))
    if args.only in (None, "stop"):
        figures.update(measure_stop())
    report(figures, args.json)


if __name__ == "__main__":
    main()
