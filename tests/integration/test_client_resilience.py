"""Client resilience against a real coordinator on loopback: the outbox delivers an update
exactly once across a client "kill" and restart, a too-stale pending update is discarded with
its reason logged, deltas replace full downloads, and retries, resumed bytes and time offline
reach the coordinator's event log. Plus the delta fallbacks, against a fake link.

A "kill" is in-process: the session task is cancelled while its upload (or commit reply) is
held back by a wrapped ``Transport``; a new ``ClientSession`` with the same name and outbox
directory plays the restarted process. Backoff never sleeps for real.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Iterable, Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    CoordinatorFactory,
    FakeClock,
    TowardTrainer,
    block_until,
    gather_bounded,
    run_async,
    target_of,
    wait_until,
)

from fedlink.aggregate.flushguard import RobustConfig
from fedlink.client import (
    ClientOptions,
    ClientSession,
    DiskOutbox,
    PendingUpdate,
    RetryPolicy,
    SessionStats,
    Transport,
)
from fedlink.client.liveness import Progress
from fedlink.client.retry import Caller
from fedlink.client.transfer import HeldModel, Transfers, model_checksum
from fedlink.compress import get_codec
from fedlink.compress.delta import DELTA_ENCODING, encode_delta
from fedlink.coordinator import CoordinatorConfig, CoordinatorServer, FlushRule, LimitsConfig
from fedlink.errors import ConfigError, NotFound, Unavailable
from fedlink.messages import (
    CommitReply,
    CommitRequest,
    DataChunk,
    DownloadRequest,
    Task,
    TensorHeader,
    UploadChunk,
    UploadReply,
    UploadStatusRequest,
)
from fedlink.wire import checksum, pack

pytestmark = pytest.mark.timeout(60)

DIM = 64
PAYLOAD_BYTES = 4 * DIM
X0 = np.linspace(-1.0, 1.0, DIM, dtype=np.float32)
FAST_RETRY = RetryPolicy(initial_backoff_s=0.01, max_backoff_s=0.05, max_attempts=5)
LIMITS = LimitsConfig(chunk_bytes=100, long_poll_s=2.0, retry_after_s=0.05)


def options(name: str, outbox: Path | None = None, **kwargs: object) -> ClientOptions:
    return ClientOptions(name=name, retry=FAST_RETRY, outbox_dir=outbox,
                         **kwargs)  # type: ignore[arg-type]


def fedavg(model: np.ndarray, trainers: list[TowardTrainer], rounds: int) -> np.ndarray:
    """Hand-computed synchronous FedAvg with every trainer in every round."""
    x = model.astype(np.float64)
    for _ in range(rounds):
        total = sum(t.examples for t in trainers)
        x = x + sum(t.examples * t.step(x) for t in trainers) / total
    return x


class Killer:
    """Wraps ``Transport`` so the victim's session hangs at a chosen point, to be cancelled.

    ``point="upload"``: the victim's first upload delivers one chunk, then hangs (killed
    mid-upload). ``point="commit"``: its first commit reaches the coordinator and is accepted,
    but the reply never arrives (killed before the outbox entry is removed).
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch, point: str) -> None:
        self.point = point
        self.victim: ClientSession | None = None
        self.fired = asyncio.Event()
        self._upload = Transport.upload
        self._commit = Transport.commit
        killer = self

        async def upload(transport: Transport, chunks: Iterable[UploadChunk],
                         patience: float = 1.0) -> UploadReply:
            return await killer.upload(transport, chunks)

        async def commit(transport: Transport, request: CommitRequest) -> CommitReply:
            return await killer.commit(transport, request)

        monkeypatch.setattr(Transport, "upload", upload)
        monkeypatch.setattr(Transport, "commit", commit)

    def _strikes(self, client_id: str, point: str) -> bool:
        return (point == self.point and not self.fired.is_set()
                and self.victim is not None and client_id == self.victim.client_id)

    async def _hang(self) -> None:
        self.fired.set()
        await asyncio.Event().wait()  # until the test cancels the session

    async def upload(self, transport: Transport, chunks: Iterable[UploadChunk],
                     patience: float = 1.0) -> UploadReply:
        stream = iter(chunks)
        first = next(stream)
        if self._strikes(first.client_id, "upload"):
            await self._upload(transport, [first])
            await self._hang()
        return await self._upload(transport, itertools.chain([first], stream))

    async def commit(self, transport: Transport, request: CommitRequest) -> CommitReply:
        reply = await self._commit(transport, request)
        if self._strikes(request.client_id, "commit"):
            await self._hang()
        return reply

    async def kill(self, run: asyncio.Future[SessionStats]) -> None:
        """Wait until the victim hangs at its point, then cancel its session."""
        await asyncio.wait_for(self.fired.wait(), 10)
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run


def accepted_for(server: CoordinatorServer, task_id: str) -> list[dict[str, object]]:
    return [e for e in server.events.of_kind("update_accepted") if e["task_id"] == task_id]


@pytest.mark.parametrize("point", ["upload", "commit"])
def test_killed_client_delivers_its_update_exactly_once_after_restart(
        coordinator: CoordinatorFactory, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        caplog: pytest.LogCaptureFixture, point: str) -> None:
    rounds = 2
    # plain FedAvg: the flush guard is covered by tests/security and tests/unit/test_flush_guard.py
    config = CoordinatorConfig(rounds=rounds, flush=FlushRule(goal=2, deadline_s=None),
                               limits=LIMITS, robust=RobustConfig(enabled=False))
    a_trainer = TowardTrainer(np.full(DIM, 2.0, np.float32), examples=10)
    b_trainer = TowardTrainer(np.full(DIM, -1.0, np.float32), examples=30)
    killer = Killer(monkeypatch, point)
    outbox = tmp_path / "outbox"

    async def main() -> tuple[CoordinatorServer, ClientSession, str]:
        async with coordinator(config, X0) as server:
            target = target_of(server)
            a = ClientSession(target, a_trainer, options("dev-a", outbox))
            killer.victim = a
            b = ClientSession(target, b_trainer, options("dev-b"))
            b_run = asyncio.ensure_future(b.run())
            await killer.kill(asyncio.ensure_future(a.run()))
            (pending,) = DiskOutbox(outbox).pending()  # the "dead" client's update survived
            assert (pending.client_id, pending.client_name) == (a.client_id, "dev-a")
            restarted = ClientSession(target, a_trainer, options("dev-a", outbox))
            await gather_bounded(restarted.run(), b_run)
            await asyncio.wait_for(server.wait_finished(), 10)
        return server, restarted, pending.task_id

    with caplog.at_level(logging.INFO, logger="fedlink.client"):
        server, restarted, task_id = run_async(main())

    (event,) = accepted_for(server, task_id)  # counted once
    assert [f["num_updates"] for f in server.events.of_kind("flush")] == [2] * rounds
    np.testing.assert_allclose(server.service.engine.model,
                               fedavg(X0, [a_trainer, b_trainer], rounds), rtol=1e-5)
    st = restarted.stats
    assert (st.recovered, st.accepted, st.refused, st.tasks) == (1, 2, 0, 1)
    assert DiskOutbox(outbox).pending() == []
    messages = [r.getMessage() for r in caplog.records]
    assert any("outbox holds update" in m for m in messages)
    if point == "upload":  # one 100-byte chunk was held; the rest was resumed from there
        assert st.resumed_bytes == 100
        assert any(f"at offset 100 of {PAYLOAD_BYTES}" in m for m in messages)
        assert event["resumed_bytes"] == 100
    # the same instance (its key kept in the outbox dir) joined again under the same id: one
    # client, not two, and nothing to retire
    assert restarted.client_id == event["client_id"]
    assert len({e["client_id"] for e in server.events.of_kind("client_joined")}) == 2
    assert not any(e["reason"].startswith("restarted as")
                   for e in server.events.of_kind("client_left"))


def test_restarted_client_discards_a_too_stale_update_and_says_why(
        coordinator: CoordinatorFactory, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """The run moved on without the dead client (goal 1, max_staleness 0): too stale."""
    config = CoordinatorConfig(
        rounds=3, flush=FlushRule(goal=1, over_selection=2.0, deadline_s=None), limits=LIMITS)
    killer = Killer(monkeypatch, "upload")
    outbox = tmp_path / "outbox"
    a_trainer = TowardTrainer(np.full(DIM, 5.0, np.float32), examples=10)

    def b_gate(call: int) -> None:  # b trains on version 0 only once a holds its task too
        if call == 0:
            block_until(killer.fired.is_set, 10, "a's upload to start")

    b_trainer = TowardTrainer(np.full(DIM, 1.0, np.float32), examples=10, before_train=b_gate)

    async def main() -> tuple[CoordinatorServer, ClientSession, str]:
        async with coordinator(config, X0) as server:
            target = target_of(server)
            a = ClientSession(target, a_trainer, options("dev-a", outbox))
            killer.victim = a
            b_run = asyncio.ensure_future(
                ClientSession(target, b_trainer, options("dev-b")).run())
            await killer.kill(asyncio.ensure_future(a.run()))
            (pending,) = DiskOutbox(outbox).pending()
            await wait_until(lambda: server.service.engine.version >= 1, 10, "version 1")
            # only the recovery: the run itself may be over before this client asks for work
            restarted = ClientSession(target, a_trainer, options("dev-a", outbox, max_tasks=0))
            await gather_bounded(restarted.run(), b_run)
            await asyncio.wait_for(server.wait_finished(), 10)
        return server, restarted, pending.task_id

    with caplog.at_level(logging.WARNING, logger="fedlink.client"):
        server, restarted, task_id = run_async(main())

    assert accepted_for(server, task_id) == []
    assert restarted.stats.recovered == 0
    (reason,) = restarted.stats.refusals
    assert reason.startswith("too stale / task closed: trained on version 0, the coordinator "
                             "is at version ")
    assert reason.endswith("(max_staleness 0)")
    assert any("discarding pending update" in r.getMessage() and "too stale" in r.getMessage()
               for r in caplog.records)
    assert DiskOutbox(outbox).pending() == []


def pending_update(target: str, client_id: str, run_name: str, tag: str) -> PendingUpdate:
    return PendingUpdate(
        target=target, run_name=run_name, client_name="dev", client_id=client_id,
        upload_id=f"{client_id}-t1-v0-{tag}", task_id="t1-v0", base_version=0,
        num_examples=10, steps_completed=1, steps_planned=1,
        payload=pack(np.ones(DIM, np.float32), get_codec("fp32")))


@pytest.mark.parametrize(("client_id", "run_name", "reason"), [
    ("c1", "old-run", "it was trained for run 'old-run'; the coordinator runs 'fedlink-run'"),
    ("c999", "fedlink-run", "does not know its client or task any more: UNAUTHENTICATED"),
])
def test_pending_update_the_coordinator_cannot_take_is_discarded(
        coordinator: CoordinatorFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture,
        client_id: str, run_name: str, reason: str) -> None:
    """A coordinator restarted (a new run, or one that forgot its clients) cannot take it."""
    config = CoordinatorConfig(rounds=1, flush=FlushRule(goal=1, deadline_s=None),
                               limits=LIMITS)
    trainer = TowardTrainer(np.ones(DIM, np.float32))

    async def main() -> tuple[CoordinatorServer, ClientSession]:
        async with coordinator(config, X0) as server:
            target = target_of(server)
            elsewhere = pending_update("10.0.0.1:5000", "c1", "fedlink-run", "elsewhere")
            DiskOutbox(tmp_path).put(elsewhere)
            DiskOutbox(tmp_path).put(pending_update(target, client_id, run_name, "here"))
            session = ClientSession(target, trainer, options("dev", tmp_path))
            await asyncio.wait_for(session.run(), 20)
        return server, session

    with caplog.at_level(logging.WARNING, logger="fedlink.client"):
        server, session = run_async(main())
    assert (session.stats.refused, session.stats.recovered, session.stats.accepted) == (1, 0, 1)
    assert reason in session.stats.refusals[0]
    assert any("discarding pending update" in r.getMessage() for r in caplog.records)
    # the entry meant for another coordinator is left for it, and said so
    assert [u.target for u in DiskOutbox(tmp_path).pending()] == ["10.0.0.1:5000"]
    assert any("leaving pending update" in r.getMessage() for r in caplog.records)
    assert [e["task_id"] for e in server.events.of_kind("update_accepted")] == ["t1-v0"]


def test_second_round_downloads_a_delta(coordinator: CoordinatorFactory) -> None:
    dim = 4096
    x0 = np.linspace(-1.0, 1.0, dim, dtype=np.float32)
    rounds = 3
    config = CoordinatorConfig(rounds=rounds, flush=FlushRule(goal=1, deadline_s=None),
                               limits=LimitsConfig(long_poll_s=2.0, retry_after_s=0.05))
    trainer = TowardTrainer(x0 + 0.001, examples=10)  # small steps: a compressible delta

    async def main() -> tuple[CoordinatorServer, ClientSession]:
        async with coordinator(config, x0) as server:
            session = ClientSession(target_of(server), trainer, options("dev"))
            await asyncio.wait_for(session.run(), 20)
            await asyncio.wait_for(server.wait_finished(), 10)
        return server, session

    server, session = run_async(main())
    full = 4 * dim
    st = session.stats
    assert st.accepted == rounds
    assert st.delta_bytes_saved > 0
    assert st.bytes_down == rounds * full - st.delta_bytes_saved
    downloads = server.events.of_kind("download_finished")
    assert [bool(d["delta"]) for d in downloads] == [False, True, True]
    np.testing.assert_allclose(server.service.engine.model, fedavg(x0, [trainer], rounds),
                               rtol=1e-5)


class Stumbling:
    """Fails the first ``n`` uploads (before sending) with UNAVAILABLE; notes the fake time."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, clock: FakeClock, n: int) -> None:
        self.clock = clock
        self.left = n
        self.times: list[float] = []
        self._upload = Transport.upload
        stumbling = self

        async def upload(transport: Transport, chunks: Iterable[UploadChunk],
                         patience: float = 1.0) -> UploadReply:
            return await stumbling.upload(transport, chunks)

        monkeypatch.setattr(Transport, "upload", upload)

    async def upload(self, transport: Transport, chunks: Iterable[UploadChunk],
                     patience: float = 1.0) -> UploadReply:
        self.times.append(self.clock.now)
        if self.left:
            self.left -= 1
            raise Unavailable("link down")
        return await self._upload(transport, chunks)


def test_retries_and_time_offline_reach_the_event_log(
        coordinator: CoordinatorFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    config = CoordinatorConfig(rounds=1, flush=FlushRule(goal=1, deadline_s=None),
                               limits=LimitsConfig(chunk_bytes=100, long_poll_s=2.0,
                                                   heartbeat_interval_s=30.0))
    clock = FakeClock()
    stumbling = Stumbling(monkeypatch, clock, n=2)

    async def fake_sleep(seconds: float) -> None:
        clock.advance(seconds)
        await asyncio.sleep(0)

    async def main() -> tuple[CoordinatorServer, ClientSession]:
        async with coordinator(config, X0) as server:
            session = ClientSession(target_of(server), TowardTrainer(np.ones(DIM, np.float32)),
                                    options("dev"), sleep=fake_sleep, clock=clock)
            await asyncio.wait_for(session.run(), 20)
            await asyncio.wait_for(server.wait_finished(), 10)
        return server, session

    server, session = run_async(main())
    offline = stumbling.times[-1] - stumbling.times[0]
    assert offline > 0
    assert session.stats.retries == 2
    assert session.stats.offline_seconds == pytest.approx(offline)
    (event,) = server.events.of_kind("update_accepted")
    assert event["retries"] == 2
    assert event["offline_seconds"] == pytest.approx(offline)
    assert event["resumed_bytes"] == 0


# -- delta paths against a fake link ------------------------------------------------------------


class FakeDownloads:
    """Serves a full model and a delta payload; a missing delta is NOT_FOUND."""

    def __init__(self, full: bytes, delta: bytes | None) -> None:
        self.payloads = {False: full, True: delta}
        self.requests: list[DownloadRequest] = []

    async def _stream(self, request: DownloadRequest) -> AsyncIterator[DataChunk]:
        data = self.payloads[request.delta]
        if data is None:
            raise NotFound("no delta")
        step = request.max_chunk_bytes
        for offset in range(request.offset, len(data), step):
            yield DataChunk(offset, data[offset:offset + step])

    def download(self, request: DownloadRequest,
                 progress: Progress | None = None) -> AsyncIterator[DataChunk]:
        self.requests.append(request)
        return self._stream(request)

    async def upload(self, chunks: Iterator[UploadChunk], patience: float = 1.0) -> UploadReply:
        raise NotImplementedError

    async def upload_status(self, request: UploadStatusRequest) -> UploadReply:
        raise NotImplementedError


def delta_task(old: np.ndarray, new: np.ndarray, delta: bytes | None) -> tuple[Task, bytes]:
    full = pack(new, get_codec("fp32"))
    header = None if delta is None else TensorHeader(
        DELTA_ENCODING, (new.size,), "float32", len(delta), checksum(delta))
    task = Task("t9-v2", 2, 1, 1, 0.0, full.header, header, 1 if delta is not None else -1)
    return task, full.data


def fetch(link: FakeDownloads, task: Task, held: HeldModel) -> tuple[np.ndarray, Transfers]:
    stats = SessionStats()
    transfers = Transfers(link, Caller(FAST_RETRY, stats), stats, chunk_bytes=4096)
    return asyncio.run(transfers.fetch_model("c1", task, held)), transfers


OLD = np.linspace(-1.0, 1.0, 1000, dtype=np.float32)
NEW = OLD + np.float32(0.001)


def test_delta_is_applied_and_counted() -> None:
    delta = encode_delta(OLD, NEW)
    task, full = delta_task(OLD, NEW, delta)
    link = FakeDownloads(full, delta)
    model, transfers = fetch(link, task, HeldModel(1, OLD, model_checksum(OLD, "fp32")))
    np.testing.assert_array_equal(model, NEW)
    assert [r.delta for r in link.requests] == [True]
    assert transfers.stats.bytes_down == len(delta)
    assert transfers.stats.delta_bytes_saved == len(full) - len(delta)


@pytest.mark.parametrize("problem", ["wrong result", "not found"])
def test_delta_problems_fall_back_to_the_full_model(
        problem: str, caplog: pytest.LogCaptureFixture) -> None:
    # "wrong result": a well-formed delta from a different base than the one held
    delta = None if problem == "not found" else encode_delta(OLD + 1, NEW)
    task, full = delta_task(OLD, NEW, delta if delta is not None else b"")
    link = FakeDownloads(full, delta)
    with caplog.at_level(logging.WARNING, logger="fedlink.client.transfer"):
        model, transfers = fetch(link, task, HeldModel(1, OLD, model_checksum(OLD, "fp32")))
    np.testing.assert_array_equal(model, NEW)
    assert [r.delta for r in link.requests] == [True, False]
    assert transfers.stats.delta_bytes_saved == 0
    assert transfers.stats.bytes_down == len(full) + len(delta or b"")
    assert any("downloading the full model" in r.getMessage() for r in caplog.records)


def test_delta_from_another_version_than_held_is_not_used() -> None:
    delta = encode_delta(OLD, NEW)
    task, full = delta_task(OLD, NEW, delta)
    link = FakeDownloads(full, delta)
    # holds v0, the task offers a delta from v1
    model, _ = fetch(link, task, HeldModel(0, OLD, model_checksum(OLD, "fp32")))
    np.testing.assert_array_equal(model, NEW)
    assert [r.delta for r in link.requests] == [False]


def test_held_model_of_the_task_version_is_not_downloaded_again() -> None:
    task, full = delta_task(OLD, NEW, None)
    link = FakeDownloads(full, None)
    model, transfers = fetch(link, task, HeldModel(2, NEW, model_checksum(NEW, "fp32")))
    np.testing.assert_array_equal(model, NEW)
    assert link.requests == []
    assert transfers.stats.delta_bytes_saved == len(full)



# -- the retry policy as configuration ----------------------------------------------------------


def test_retry_policy_from_a_config_table() -> None:
    policy = RetryPolicy.from_dict({"initial_backoff_s": 1, "max_attempts": 7})
    assert policy == RetryPolicy(initial_backoff_s=1.0, max_attempts=7)
    assert RetryPolicy.from_dict({}) == RetryPolicy()


@pytest.mark.parametrize(("table", "message"), [
    ({"max_retries": 3}, r"\[client.retry\] has unknown keys \['max_retries'\]"),
    ({"max_attempts": 2.5}, "retry.max_attempts: expected an integer"),
    ({"max_attempts": True}, "retry.max_attempts: expected an integer"),
    ({"budget_s": "60"}, "retry.budget_s: expected a number"),
    ({"initial_backoff_s": -1}, "retry.initial_backoff_s: must be > 0"),
])
def test_retry_policy_from_a_bad_table_is_a_config_error(table: dict[str, object],
                                                        message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RetryPolicy.from_dict(table)
