"""Finding 6 (and issue 26's record): a stop takes seconds and leaves the run's record.

One SIGTERM took 50 s with one silent client and 150 s with a client heartbeating (the drain
waited for every client to go quiet); a SIGTERM at the cap left no ``summary.json`` and no
model. Now ``summary.json`` and the model are written first, callers are told to come back
(``UNAVAILABLE`` with a retry hint) and the stop ends within ``[coordinator] drain_s``.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import stat
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from _hostile import FP32, Answer, Raw, answer_of
from conftest import run_async, wait_until

# the process helpers of the deployables' tests (``spawn`` kills what a test left running)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from test_deployables import FEDLINK, LISTENING, STARTUP_S, Spawner, spawn

from fedlink.aggregate.flushguard import RobustConfig
from fedlink.coordinator import CoordinatorConfig, CoordinatorServer, FlushRule
from fedlink.coordinator.config import SecureConfig
from fedlink.coordinator.server import serve_until_done
from fedlink.metrics import EventLog
from fedlink.proto.v1 import coordinator_pb2 as pb
from fedlink.wire import pack

pytestmark = pytest.mark.timeout(120)
__all__ = ["spawn"]  # a fixture, used by name

DRAIN_S = 10.0
"""Long enough that the calls made after the gate closes reach it on a loaded machine (the
drain then ends at this bound, held open by the hanging upload)."""


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def hanging_upload(raw: Raw, client_id: str, sent: asyncio.Event,
                         release: asyncio.Event) -> Answer:
    """An ``Upload`` stream that sends one chunk and then waits for ``release``."""

    async def chunks() -> AsyncIterator[pb.UploadChunk]:
        yield pb.UploadChunk(client_id=client_id, upload_id="slow-1", offset=0,
                             data=b"\x01" * 1024)
        sent.set()
        await release.wait()

    return await answer_of(raw.stub.Upload(chunks(), timeout=60))


def test_a_stop_tells_callers_to_come_back_writes_the_record_first_and_keeps_acks(
        tmp_path: Path) -> None:
    state = tmp_path / "state"
    config = CoordinatorConfig(rounds=5, flush=FlushRule(goal=2, deadline_s=None),
                               state_dir=str(state), drain_s=DRAIN_S)
    records: list[tuple[bool, bool]] = []

    async def scenario() -> tuple[Answer, Answer, Answer, list[dict[str, object]]]:
        stop = asyncio.Event()
        with EventLog(tmp_path / "events.jsonl") as events:
            server = CoordinatorServer(config, np.zeros(8, np.float32), events)

            def record() -> None:  # what the gate and the server were doing at the time
                records.append((server.gate.closed.is_set(), server._server is not None))

            serving = asyncio.ensure_future(serve_until_done(server, stop=stop,
                                                             on_record=record))
            await wait_until(lambda: server.port != 0, what="the server listening")
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                raw = Raw(channel)
                a, b, c = [await raw.client(n) for n in "abc"]
                task_a = await raw.task(a)
                await raw.task(b)  # the cohort of 2 is full now
                acked = await raw.commit(a, task_a, pack(np.ones(8, np.float32), FP32), 10,
                                         "a-up", inline=True)
                assert acked.code == "OK", acked
                waiting = asyncio.ensure_future(answer_of(raw.stub.GetTask(
                    pb.GetTaskRequest(client_id=c, held_version=-1), timeout=30)))
                sent, release = asyncio.Event(), asyncio.Event()
                upload = asyncio.ensure_future(hanging_upload(raw, b, sent, release))
                await sent.wait()
                # the chunk written on the coordinator: the upload is a call it holds open (the
                # client's send alone can stop before the call reaches it, and a stop with no
                # call in flight ends at once)
                await wait_until(lambda: server.service.uploads.open_uploads() >= 1,
                                 what="the coordinator holding the upload")
                stop.set()
                await wait_until(server.gate.closed.is_set, what="the gate closing")
                heartbeat = await answer_of(raw.stub.Heartbeat(
                    pb.HeartbeatRequest(client_id=b), timeout=10))
                long_poll = await waiting
                await serving  # the hanging upload does not hold the stop beyond drain_s
                release.set()
                cut = await upload
        return heartbeat, long_poll, cut, server.events.events

    heartbeat, long_poll, cut, logged = run_async(scenario(), timeout=60)
    for answer in (heartbeat, long_poll):
        assert answer.code == "UNAVAILABLE", answer
        assert "come back" in answer.detail
        assert answer.retry_delay is not None and answer.retry_delay >= DRAIN_S
    assert cut.code != "OK"  # cut at the bound, not waited for
    # the record was written first: with the gate closed, the server still up
    assert records and records[0] == (True, True)
    assert [e["reason"] for e in logged if e["kind"] == "run_finished"] == ["stopped by signal"]

    async def restarted() -> list[dict[str, object]]:
        with EventLog(tmp_path / "events2.jsonl") as events:
            async with CoordinatorServer(config, np.zeros(8, np.float32), events) as server:
                return list(server.events.events)

    (restored,) = [e for e in run_async(restarted()) if e["kind"] == "coordinator_restored"]
    assert restored["pending_updates"] == 1  # a's acknowledged update survived the stop


def test_a_stop_tells_secure_members_waiting_for_their_phase_to_come_back_at_once(
        tmp_path: Path) -> None:
    """Two members of a secure group wait for a third (a long ``phase_s``): their advertise
    calls are long polls nothing durable can come of once the gate refuses the later phases'
    calls, so a stop answers them at once, as it does a ``GetTask`` waiting for a task,
    instead of holding them (and the stop) to ``drain_s``."""
    config = CoordinatorConfig(
        rounds=5, flush=FlushRule(goal=3, min_updates=2, deadline_s=None), drain_s=60.0,
        robust=RobustConfig(enabled=False), norm_bound_adaptive=False,
        secure=SecureConfig(enabled=True, phase_s=60.0))

    async def scenario() -> tuple[list[Answer], int]:
        stop = asyncio.Event()
        with EventLog(tmp_path / "events.jsonl") as events:
            server = CoordinatorServer(config, np.zeros(8, np.float32), events)
            serving = asyncio.ensure_future(serve_until_done(server, stop=stop))
            await wait_until(lambda: server.port != 0, what="the server listening")
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                raw = Raw(channel)
                adverts = []
                for i in range(2):
                    client = await raw.client(f"m{i}")
                    task = await raw.task(client)
                    adverts.append(asyncio.ensure_future(answer_of(raw.stub.SecureAdvertise(
                        pb.SecureAdvertiseRequest(client_id=client, task_id=task.task_id,
                                                  cipher_public=bytes([i + 1]) * 32,
                                                  mask_public=bytes([i + 9]) * 32),
                        timeout=90))))
                desk = server.service.secure
                assert desk is not None
                await wait_until(lambda: desk.group is not None and len(desk.group.members) == 2,
                                 what="both members in the roster")
                stop.set()
                answers = list(await asyncio.gather(*adverts))
                await serving
        return answers, server.gate.refused

    answers, refused = run_async(scenario(), timeout=60)  # a held call would take drain_s
    for answer in answers:
        assert answer.code == "UNAVAILABLE", answer
        assert "come back" in answer.detail  # the gate's answer, not a cut at the bound
        assert answer.retry_delay is not None and answer.retry_delay >= 60.0
    assert refused == 2


HOOK = '''
import time
from pathlib import Path

from fedlink.aggregate.base import FlushHook


class SlowFlush(FlushHook):
    """Marks that a flush began, then takes a while (the loop is blocked meanwhile)."""

    def __init__(self, marker: str = "") -> None:
        self.marker = marker

    def on_flush(self, mean_delta, flush):
        Path(self.marker).write_text(str(flush.version))
        time.sleep(2.0)
        return mean_delta
'''


def serve_config(tmp_path: Path, drain_s: float) -> Path:
    (tmp_path / "slowhook.py").write_text(textwrap.dedent(HOOK))
    config = tmp_path / "stop.toml"
    config.write_text(f"""
[run]
name = "stop"
[data]
dataset = "digits"
clients = 2
[model]
name = "logreg"
[coordinator]
rounds = 100
drain_s = {drain_s}
state_dir = "{tmp_path / 'state'}"
[[coordinator.hooks]]
name = "slowhook:SlowFlush"
marker = "{tmp_path / 'flushing'}"
[coordinator.flush]
goal = 2
min_updates = 2
deadline_s = 0.0
""")
    return config


def check_record(run_dir: Path) -> dict[str, object]:
    summary = json.loads((run_dir / "summary.json").read_text())
    model = np.load(run_dir / "model.npy")
    assert model.dtype == np.float32 and model.size == 8 * 8 * 10 + 10  # logreg on digits
    assert np.isfinite(model).all() and "rounds" in summary
    for name in ("summary.json", "model.npy", "model.pt"):
        assert mode(run_dir / name) == 0o600, name
    return summary


class Driver:
    """Raw clients of a ``fedlink serve`` process, on this test's own event loop."""

    def __init__(self, address: str) -> None:
        self.address = address

    async def run(self, instant: str, ready: asyncio.Event, stopped: asyncio.Event,
                  marker: Path) -> list[Answer]:
        """Bring the run to ``instant``, set ``ready``, and heartbeat until ``stopped``."""
        heard: list[Answer] = []
        async with grpc.aio.insecure_channel(self.address) as channel:
            raw = Raw(channel)
            joined = await raw.join("a")
            size = joined.reply.config.num_parameters  # type: ignore[attr-defined]
            a, b = str(joined.reply.client_id), await raw.client("b")  # type: ignore
            task_a, task_b = await raw.task(a), await raw.task(b)
            release = asyncio.Event()
            if instant == "mid_upload":
                sent = asyncio.Event()
                upload = asyncio.ensure_future(hanging_upload(raw, a, sent, release))
                await sent.wait()
            elif instant == "during_flush":
                delta = pack(np.zeros(size, np.float32), FP32)
                for client, task in ((a, task_a), (b, task_b)):
                    acked = await raw.commit(client, task, delta, 10, f"{client}-up",
                                             inline=True)
                    assert acked.code == "OK", acked
                await wait_until(marker.exists, 30, "the flush to begin")
            ready.set()
            while not stopped.is_set():  # a client heartbeating through the stop
                heard.append(await answer_of(raw.stub.Heartbeat(
                    pb.HeartbeatRequest(client_id=b, task_id=task_b.task_id), timeout=5)))
                if heard[-1].code != "OK":
                    break
                await asyncio.sleep(0.2)
            release.set()
            if instant == "mid_upload":
                await upload
        return heard


@pytest.mark.parametrize("instant", ["before_first_flush", "mid_upload", "during_flush"])
def test_sigterm_at_any_instant_leaves_summary_and_model_and_ends_by_itself(
        spawn: Spawner, tmp_path: Path, instant: str) -> None:
    config = serve_config(tmp_path, drain_s=DRAIN_S)
    spawn.env["PYTHONPATH"] = f"{tmp_path}:{spawn.env.get('PYTHONPATH', '')}"
    serve = spawn([*FEDLINK, "serve", "--config", str(config), "--host", "127.0.0.1",
                   "--port", "0", "--output-dir", str(tmp_path / "runs")])
    match = serve.wait_for(LISTENING, STARTUP_S)
    driver = Driver(f"{match[1]}:{match[2]}")

    async def scenario() -> list[Answer]:
        ready, stopped = asyncio.Event(), asyncio.Event()
        driving = asyncio.ensure_future(driver.run(instant, ready, stopped,
                                                   tmp_path / "flushing"))
        await asyncio.wait({driving, asyncio.ensure_future(ready.wait())},
                           return_when=asyncio.FIRST_COMPLETED)
        if driving.done():
            driving.result()  # it failed before the instant: say why
        serve.popen.send_signal(signal.SIGTERM)
        # it ends by itself, heartbeats or not (the test's timeout is the only clock here)
        await asyncio.to_thread(serve.popen.wait)
        stopped.set()
        return await driving

    heard = run_async(scenario(), timeout=90)
    assert serve.finish(timeout_s=30) == 0, serve.output
    summary = check_record(tmp_path / "runs" / "stop")
    assert summary["clients"] == 2
    refused = [h for h in heard if h.code == "UNAVAILABLE" and h.retry_delay]
    if refused:  # a heartbeat that reached the stopping coordinator was told to come back
        assert "come back" in refused[0].detail


def test_a_kill_during_the_drain_still_finds_summary_and_model(
        spawn: Spawner, tmp_path: Path) -> None:
    config = serve_config(tmp_path, drain_s=600.0)  # the drain would outlast any supervisor
    spawn.env["PYTHONPATH"] = f"{tmp_path}:{spawn.env.get('PYTHONPATH', '')}"
    serve = spawn([*FEDLINK, "serve", "--config", str(config), "--host", "127.0.0.1",
                   "--port", "0", "--output-dir", str(tmp_path / "runs")])
    match = serve.wait_for(LISTENING, STARTUP_S)
    run_dir = tmp_path / "runs" / "stop"

    async def scenario() -> None:
        async with grpc.aio.insecure_channel(f"{match[1]}:{match[2]}") as channel:
            raw = Raw(channel)
            a = await raw.client("a")
            sent, release = asyncio.Event(), asyncio.Event()
            upload = asyncio.ensure_future(hanging_upload(raw, a, sent, release))
            await sent.wait()
            serve.popen.send_signal(signal.SIGTERM)
            await wait_until(lambda: (run_dir / "model.npy").exists(), 60, "the record")
            assert serve.popen.poll() is None  # still draining: the record came first
            serve.popen.send_signal(signal.SIGKILL)  # what a supervisor's timeout does
            release.set()
            await upload

    run_async(scenario(), timeout=90)
    serve.finish(timeout_s=30)
    check_record(run_dir)


def test_the_shipped_supervisors_wait_longer_than_the_drain() -> None:
    """The unit allowed 60 s and compose 10 s (less than a drain plus a model write)."""
    server_dir = Path(__file__).resolve().parents[2] / "server"
    unit = (server_dir / "fedlink-coordinator.service").read_text()
    found = re.search(r"^TimeoutStopSec=(\d+)$", unit, flags=re.MULTILINE)
    assert found is not None
    compose = (server_dir / "compose.yaml").read_text()
    grace = re.search(r"^\s+stop_grace_period: (\d+)s$", compose, flags=re.MULTILINE)
    assert grace is not None
    drain = CoordinatorConfig().drain_s
    for allowed in (int(found[1]), int(grace[1])):
        assert drain + 10 <= allowed <= 60  # the drain, the record, and no more than a minute
