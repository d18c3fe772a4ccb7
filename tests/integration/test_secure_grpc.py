"""A secure round over real gRPC: clients die between phases, the sum of the rest is exact,
and the coordinator never holds, logs or writes an individual update in the clear."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import logging
import re
import signal
import sys
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import TowardTrainer, run_async, target_of, wait_until

pytest.importorskip("cryptography")

from fedlink.aggregate import RobustConfig
from fedlink.client import ClientOptions, ClientSession, RetryPolicy
from fedlink.client.pipeline import UpdatePipeline
from fedlink.client.protocol import Action, MaskedUpload, Unmask
from fedlink.client.secure import SecureDelivery
from fedlink.config import load_toml
from fedlink.coordinator import CoordinatorConfig, FlushRule, LimitsConfig
from fedlink.coordinator.config import SecureConfig
from fedlink.coordinator.secure import (
    ADVERTISE,
    MASKED,
    SHARE,
    UNMASK,
    SecureDesk,
    SecureGroup,
)
from fedlink.coordinator.server import CoordinatorServer
from fedlink.coordinator.service import CoordinatorService
from fedlink.errors import ConfigError, UpdateRefused
from fedlink.experiment.config import ExperimentConfig
from fedlink.messages import (
    GetTaskRequest,
    JoinRequest,
    SecureAdvertiseRequest,
    SecureShareRequest,
    Task,
)
from fedlink.metrics import EventLog, summarize
from fedlink.params.base import BUFFER, COUNTER, FROZEN, TRAINABLE, ParamSpec
from fedlink.refusals import RefusalCode
from fedlink.secagg import decode_sum, encode_weighted
from fedlink.secagg.graph import neighbours
from fedlink.secagg.sparse import group_indices

pytestmark = pytest.mark.timeout(90)

DIM = 32
CLIENTS = 5
PHASE_S = 1.5
X0 = np.zeros(DIM, dtype=np.float32)
FAST_RETRY = RetryPolicy(initial_backoff_s=0.01, max_backoff_s=0.05, max_attempts=5)


class Killed(Exception):
    """The client process 'died' here: it sends nothing more, heartbeats stop."""


class DiesBefore(ClientSession):
    """A client that dies just before the secure phase ``before`` (its earlier phases done)."""

    def __init__(self, *args: Any, before: type, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.before = before

    async def _masked_upload(self, action: MaskedUpload, work: Any, *rest: Any) -> Action:
        if self.before is MaskedUpload:  # after sharing keys: its pairwise masks must go
            await work.keys
            raise Killed("after sharing keys")
        return await super()._masked_upload(action, work, *rest)

    async def _unmask(self, action: Unmask, *rest: Any) -> Action:
        if self.before is Unmask:  # its masked update is in: its self mask must go
            raise Killed("during unmasking")
        return await super()._unmask(action, *rest)


def secure_config(state_dir: Path, inline_bytes: int = 64 << 10) -> CoordinatorConfig:
    return CoordinatorConfig(
        rounds=1, flush=FlushRule(goal=CLIENTS, min_updates=2, deadline_s=None),
        limits=LimitsConfig(long_poll_s=1.0, retry_after_s=0.05, inline_bytes=inline_bytes),
        robust=RobustConfig(enabled=False), norm_bound_adaptive=False,
        secure=SecureConfig(enabled=True, phase_s=PHASE_S), state_dir=str(state_dir))


def run_clients(server: CoordinatorServer, trainers: list[TowardTrainer]) -> list[Any]:
    """Serve one client per trainer (default options) until the run ends; their stats."""
    async def main() -> list[Any]:
        async with server:
            sessions = [ClientSession(target_of(server), trainer,
                                      ClientOptions(name=f"c{i}", retry=FAST_RETRY))
                        for i, trainer in enumerate(trainers)]
            return await asyncio.wait_for(asyncio.gather(*(s.run() for s in sessions)), 60)

    return list(run_async(main(), timeout=80))


_SKIP = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType,
         types.FrameType, types.CoroutineType, asyncio.AbstractEventLoop, asyncio.Future,
         asyncio.Handle)


def held_objects(root: object) -> list[Any]:
    """Everything reachable from ``root`` (the coordinator's service), except code, event
    loops and their tasks (which would reach the in-process clients)."""
    seen: set[int] = set()
    found, stack = [], [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _SKIP):
            continue
        seen.add(id(obj))
        found.append(obj)
        if isinstance(obj, np.ndarray | bytes | bytearray | memoryview | str):
            continue
        stack.extend(gc.get_referents(obj))
    return found


def _holds_floats(data: bytes, deltas: list[np.ndarray]) -> bool:
    """Whether ``data`` holds, at any offset, float32 or float64 values within 1e-3 of one
    of ``deltas`` (a copy, or a quantized one)."""
    for dtype in (np.float32, np.float64):
        width = np.dtype(dtype).itemsize
        for start in range(width):
            count = (len(data) - start) // width
            if count < DIM:
                continue
            with np.errstate(invalid="ignore", over="ignore"):
                values = np.frombuffer(data, dtype, count, start).astype(np.float64)
            for delta in deltas:
                with np.errstate(invalid="ignore"):
                    for at in np.flatnonzero(np.abs(values[:count - DIM + 1] - delta[0]) < 1e-3):
                        if np.allclose(values[at:at + DIM], delta, atol=1e-3):
                            return True
    return False


def leaks(obj: Any, deltas: list[np.ndarray], step: float) -> bool:
    """Whether ``obj`` is, or decodes to, one of ``deltas`` (float, or Z_m integers)."""
    if isinstance(obj, bytes | bytearray | memoryview):
        return _holds_floats(bytes(obj), deltas)
    if not isinstance(obj, np.ndarray) or obj.size < DIM:
        return False
    flat = obj.reshape(-1)
    if flat.dtype.kind == "f":
        return any(np.allclose(flat[:DIM], d, atol=1e-3) for d in deltas)
    if flat.dtype.kind in "ui":
        decoded = flat[:DIM].astype(np.float64) * step - 1.0  # one client's [w*u, w] encoding
        return any(np.allclose(decoded, d, atol=1e-3) for d in deltas)
    return False


@pytest.mark.parametrize("inline_bytes", [64 << 10, 0], ids=["inline", "resumable-upload"])
def test_secure_round_survives_dropouts_and_keeps_updates_private(
        tmp_path: Path, inline_bytes: int) -> None:
    rng = np.random.default_rng(7)
    targets = [rng.uniform(-0.8, 0.8, DIM).astype(np.float32) for _ in range(CLIENTS)]
    trainers = [TowardTrainer(t, examples=10 + i) for i, t in enumerate(targets)]
    deltas = [trainer.step(X0.astype(np.float64)) for trainer in trainers]
    config = secure_config(tmp_path / "state", inline_bytes)
    step = config.secagg().step
    server = CoordinatorServer(config, X0, EventLog(tmp_path / "events.jsonl"),
                               address="127.0.0.1:0")
    checked: dict[str, Any] = {}

    async def main() -> list[Any]:
        async with server:
            sessions = [
                (DiesBefore if i in (1, 3) else ClientSession)(
                    target_of(server), trainers[i],
                    ClientOptions(name=f"c{i}", retry=FAST_RETRY),
                    **({"before": MaskedUpload if i == 1 else Unmask} if i in (1, 3) else {}))
                for i in range(CLIENTS)]
            runs = asyncio.gather(*(s.run() for s in sessions), return_exceptions=True)
            desk = server.service.secure
            assert desk is not None

            def unmasking(group: SecureGroup, phase: int) -> None:
                # mid-round (the masked phase just closed, no share answered yet), the
                # masked total is all the coordinator has of the updates
                if phase != MASKED or group.lost:
                    return
                assert group.sum._total is not None
                survivors = sorted(group.delivered)
                checked["mid"] = [o for o in held_objects(server.service)
                                  if leaks(o, deltas, step)]
                checked["sum_hidden"] = not np.allclose(
                    decode_sum(group.sum._total, len(survivors), config.secagg())[:DIM]
                    / len(survivors),
                    np.mean([deltas[i] for i in (0, 2, 3, 4)], axis=0), atol=0.05)

            desk.on_phase = unmasking
            results = await asyncio.wait_for(runs, 60)
            await asyncio.wait_for(server.wait_finished(), 20)
            checked["end"] = [o for o in held_objects(server.service) if leaks(o, deltas, step)]
            checked["model_found"] = any(
                isinstance(o, np.ndarray) and o.shape == (DIM,) and np.array_equal(
                    o, server.service.engine.model) for o in held_objects(server.service))
            checked["ids"] = [s.client_id for s in sessions]
            return results

    results = run_async(main(), timeout=80)
    assert [type(r).__name__ for r in results] == [
        "SessionStats", "Killed", "SessionStats", "Killed", "SessionStats"]
    packed = config.secagg().vector_bytes(DIM + 1)
    for stats in (results[0], results[2], results[4]):
        assert (stats.tasks, stats.accepted, stats.refused) == (1, 1, 0)
        assert stats.bytes_up == packed  # the masked update, inline or uploaded, once
    if inline_bytes == 0:  # it rode the resumable upload, settled once taken
        assert server.service.uploads.open_uploads() == 0

    # nothing the coordinator holds, logs or writes is an individual update (the detector
    # itself recognises an update as floats, as its bytes, and as its Z_m encoding)
    config_secagg = config.secagg()
    encoded = encode_weighted(deltas[0], 1.0, config_secagg, np.random.default_rng(0)).values
    assert leaks(deltas[0].astype(np.float32), deltas, step)
    assert leaks(b"head" + deltas[2].astype(np.float32).tobytes(), deltas, step)
    assert leaks(b"x" + (deltas[1] + step).tobytes() + b"tail", deltas, step)  # float64, off
    assert leaks(encoded, deltas, step)
    assert checked["model_found"], "the memory walk must reach the engine's model"
    assert checked["sum_hidden"], "mid-round the masked total must not decode to the sum"
    assert checked["mid"] == [] and checked["end"] == []
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "events.jsonl" for p in files)
    for path in files:
        assert not leaks(path.read_bytes(), deltas, step), path
    for line in (tmp_path / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        assert not any(isinstance(v, list) and len(v) >= DIM for v in event.values()), event
    flushes = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()
               if json.loads(line).get("kind") == "flush"]
    assert [f["num_updates"] for f in flushes] == [4]  # the members inside the sum
    accepted = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()
                if json.loads(line).get("kind") == "update_accepted"]
    assert sorted(e["client_id"] for e in accepted) == sorted(
        checked["ids"][i] for i in (0, 2, 3, 4))

    # the sum is the plain sum of those that delivered a masked update (client 1 did not;
    # client 3 did, then died: its self mask was rebuilt from its neighbours' shares)
    engine = server.service.engine
    assert engine.version == 1
    expected = X0 + np.mean([deltas[i] for i in (0, 2, 3, 4)], axis=0)
    assert np.allclose(engine.model, expected, atol=4 * step)
    assert not np.allclose(engine.model, X0 + np.mean(deltas, axis=0), atol=1e-3)


def test_secagg_plus_over_grpc_sends_each_member_only_its_neighbours_keys(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sparse graph (SecAgg+, 4 neighbours in a group of 7): each member's roster names
    every member but carries keys for itself and its neighbours alone, and the masked phase's
    answer names the fate of those alone, so both grow with the neighbours, not the group; a
    member that dies after sharing keys is unmasked from its neighbours' shares and the sum of
    the others is exact."""
    clients = 7
    rng = np.random.default_rng(11)
    trainers = [TowardTrainer(rng.uniform(-0.8, 0.8, DIM).astype(np.float32), examples=10)
                for _ in range(clients)]
    deltas = [trainer.step(X0.astype(np.float64)) for trainer in trainers]
    config = dataclasses.replace(
        secure_config(tmp_path / "state"),
        flush=FlushRule(goal=clients, min_updates=2, deadline_s=None),
        secure=SecureConfig(enabled=True, phase_s=PHASE_S, neighbours=4))
    server = CoordinatorServer(config, X0, EventLog(None), address="127.0.0.1:0")
    rosters: dict[int, tuple[Any, ...]] = {}
    fates: dict[int, Any] = {}
    answer, masked_answer = SecureDesk.advertise_reply, SecureDesk.masked_reply

    def recorded(desk: SecureDesk, group: SecureGroup, *args: Any) -> Any:
        reply = answer(desk, group, *args)
        rosters[reply.index] = reply.members
        return reply

    def recorded_fate(desk: SecureDesk, group: SecureGroup, member: Any, *args: Any) -> Any:
        reply = masked_answer(desk, group, member, *args)
        fates[member.index] = reply
        return reply

    monkeypatch.setattr(SecureDesk, "advertise_reply", recorded)
    monkeypatch.setattr(SecureDesk, "masked_reply", recorded_fate)

    async def main() -> list[Any]:
        async with server:
            sessions = [(DiesBefore if i == 2 else ClientSession)(
                target_of(server), trainers[i], ClientOptions(name=f"c{i}", retry=FAST_RETRY),
                **({"before": MaskedUpload} if i == 2 else {})) for i in range(clients)]
            return await asyncio.wait_for(asyncio.gather(*(s.run() for s in sessions),
                                                         return_exceptions=True), 60)

    results = run_async(main(), timeout=80)
    assert [type(r).__name__ for r in results].count("Killed") == 1
    graph = neighbours(range(clients), 4, 1)  # the first group's graph seed is its number
    assert sorted(rosters) == list(range(clients))
    for index, members in rosters.items():
        assert [m.index for m in members] == list(range(clients))
        keyed = {m.index for m in members if m.cipher_public and m.mask_public}
        assert keyed == {index, *graph[index]}, index
    # after the masked phase each member hears the fate of itself and its neighbours alone
    dead = set(range(clients)) - set(fates)  # the dying client's index (by joining order)
    assert len(dead) == 1
    for index, fate in fates.items():
        own = {index, *graph[index]}
        assert set(fate.survivors) == own - dead and set(fate.dropped) == own & dead, index
    engine = server.service.engine
    assert engine.version == 1
    delivered = [d for i, d in enumerate(deltas) if i != 2]
    step = config.secagg().step
    np.testing.assert_allclose(engine.model, X0 + np.mean(delivered, axis=0), atol=4 * step)


def test_group_random_k_sends_the_kept_coordinates_and_feeds_back_the_rest(
        tmp_path: Path) -> None:
    """With ``density`` 0.25 each member masks and sends a quarter of its update, the same
    coordinates as the rest of its group; what it kept back joins its next group's update."""
    density, clients = 0.25, 3
    config = dataclasses.replace(
        secure_config(tmp_path / "state"), rounds=2,
        flush=FlushRule(goal=clients, min_updates=2, deadline_s=None),
        secure=SecureConfig(enabled=True, phase_s=PHASE_S, density=density), seed=11)
    rng = np.random.default_rng(3)
    targets = [rng.uniform(-0.8, 0.8, DIM).astype(np.float32) for _ in range(clients)]
    trainers = [TowardTrainer(t) for t in targets]
    server = CoordinatorServer(config, X0, EventLog(None), address="127.0.0.1:0")
    models: list[np.ndarray] = []

    async def main() -> list[Any]:
        async with server:
            desk = server.service.secure
            assert desk is not None

            def flushed(group: SecureGroup, phase: int) -> None:
                if phase == UNMASK and not group.lost:  # the group's sum made a version
                    models.append(server.service.engine.model.copy())

            desk.on_phase = flushed
            sessions = [ClientSession(target_of(server), trainers[i],
                                      ClientOptions(name=f"c{i}", retry=FAST_RETRY))
                        for i in range(clients)]
            return await asyncio.wait_for(asyncio.gather(*(s.run() for s in sessions)), 60)

    results = run_async(main(), timeout=80)
    kept = [group_indices(density, 11, number, DIM) for number in (1, 2)]
    assert all(k is not None and k.size == 8 for k in kept)
    k1, k2 = set(kept[0].tolist()), set(kept[1].tolist())
    assert k1 != k2  # each group draws its own coordinates
    secagg = config.secagg()
    for stats in results:  # two masked updates of 8 values and the weight, nothing else
        assert (stats.accepted, stats.bytes_up) == (2, 2 * secagg.vector_bytes(8 + 1))
    first = np.mean([t.step(X0.astype(np.float64)) for t in trainers], axis=0)
    v1, v2 = models
    outside = sorted(set(range(DIM)) - k1)
    assert np.array_equal(v1[outside], X0[outside])  # only group 1's coordinates moved
    assert np.allclose(v1[sorted(k1)], first[sorted(k1)], atol=4 * secagg.step)
    # a coordinate group 2 kept and group 1 did not carries both tasks' updates: the second
    # (trained where the model had not moved: the same step) and the first, fed back
    fed_back = sorted(k2 - k1)
    assert fed_back
    assert np.allclose(v2[fed_back], 2 * first[fed_back], atol=6 * secagg.step)


def test_values_beyond_the_ring_s_clip_are_counted_and_warned_of_by_their_client(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Client 0's update reaches 1.5 at two coordinates and -1.5 at a third, beyond the
    ring's clip of 1: the three values are clipped (the coordinator, which sees the sum,
    cannot tell), so client 0 counts them in ``secure_values_clipped`` and warns once;
    the others count none. Before, the cut went unrecorded: the model moved less than its
    updates with nothing saying so."""
    near = np.full(DIM, 0.4, np.float32)
    far = near.copy()
    far[:3] = [3.0, 3.0, -3.0]  # a step of rate 0.5 toward it: 1.5, 1.5, -1.5
    server = CoordinatorServer(secure_config(tmp_path / "state"), X0, EventLog(None),
                               address="127.0.0.1:0")
    with caplog.at_level(logging.WARNING, logger="fedlink.client.session"):
        results = run_clients(server, [TowardTrainer(far)] + [TowardTrainer(near)] * 4)
    assert [s.secure_values_clipped for s in results] == [3, 0, 0, 0, 0]
    warnings = [r for r in caplog.records if "beyond the secure ring's clip" in r.message]
    assert len(warnings) == 1 and warnings[0].message.startswith("3 values")
    step = secure_config(tmp_path).secagg().step
    model = server.service.engine.model
    assert model[0] == pytest.approx((1.0 + 4 * 0.2) / CLIENTS, abs=4 * step)  # not 1.5


def test_distributed_dp_over_grpc_with_group_random_k(tmp_path: Path) -> None:
    """Distributed DP with group random-k over gRPC: the settings reach the clients, each
    sends its kept coordinates noised (no weight: the coordinator names the weights), and
    the version is the members' mean on those coordinates, within the (here tiny) noise."""
    clients, z, c = 3, 1e-4, 100.0
    config = dataclasses.replace(
        secure_config(tmp_path / "state"), rounds=1, seed=5,
        flush=FlushRule(goal=clients, min_updates=2, deadline_s=None),
        secure=SecureConfig(enabled=True, phase_s=PHASE_S, density=0.5, noise_multiplier=z,
                            clip_norm=c))
    rng = np.random.default_rng(4)
    trainers = [TowardTrainer(rng.uniform(-0.8, 0.8, DIM).astype(np.float32))
                for _ in range(clients)]
    server = CoordinatorServer(config, X0, EventLog(None), address="127.0.0.1:0")

    results = run_clients(server, trainers)
    kept = group_indices(0.5, 5, 1, DIM)
    assert kept is not None and kept.size == DIM // 2
    secagg = config.secagg()
    for stats in results:  # the kept coordinates, no weight after them
        assert (stats.accepted, stats.bytes_up) == (1, secagg.vector_bytes(DIM // 2))
    model = server.service.engine.model
    first = np.mean([t.step(X0.astype(np.float64)) for t in trainers], axis=0)
    outside = np.setdiff1d(np.arange(DIM), kept)
    assert not model[outside].any()
    gamma = c / 2 ** 16
    assert np.abs(first[kept]).max() > 100 * gamma
    np.testing.assert_allclose(model[kept], first[kept], rtol=0,
                               atol=2 * gamma + 6 * z * c / clients)
    (flush,) = server.events.of_kind("flush")
    assert flush["privacy"]["mode"] == "user_distributed" and flush["epsilon"] > 0


def test_clients_at_their_default_seed_each_add_their_own_noise_share(tmp_path: Path) -> None:
    """Distributed DP over gRPC with every client left at ``ClientOptions``' default seed:
    each draws its own Skellam share, so the summed noise has the standard deviation the run
    names (``z * c``), and the mean ``z * c / n``. Clients drawing from the same seed would
    add the same share ``n`` times: ``sqrt(n)`` times the noise, and each client would know
    everyone's."""
    clients, z, c, dim = 3, 1e-3, 100.0, 2000
    config = dataclasses.replace(
        secure_config(tmp_path / "state"), rounds=1,
        flush=FlushRule(goal=clients, min_updates=clients, deadline_s=None),
        secure=SecureConfig(enabled=True, phase_s=60.0, noise_multiplier=z, clip_norm=c))
    rng = np.random.default_rng(8)
    trainers = [TowardTrainer(rng.uniform(-0.05, 0.05, dim).astype(np.float32))
                for _ in range(clients)]
    x0 = np.zeros(dim, np.float32)
    server = CoordinatorServer(config, x0, EventLog(None), address="127.0.0.1:0")

    results = run_clients(server, trainers)
    assert [stats.accepted for stats in results] == [1] * clients
    first = np.mean([t.step(x0.astype(np.float64)) for t in trainers], axis=0)
    noise = server.service.engine.model - first
    # 2000 draws: the measured deviation is within 4% of the true one (one standard error);
    # a share added three times would read sqrt(3) = 1.73 of the nominal
    assert 0.85 < float(noise.std()) / (z * c / clients) < 1.15


def test_secure_settings_that_need_individual_updates_are_refused() -> None:
    secure = SecureConfig(enabled=True)
    plain = {"robust": RobustConfig(enabled=False), "norm_bound_adaptive": False,
             "secure": secure}
    CoordinatorConfig(**plain)  # the working combination
    for change, key in ((dict(robust=RobustConfig()), "coordinator.robust.enabled"),
                        (dict(aggregator="median"), "aggregator 'median'"),
                        (dict(norm_bound_adaptive=True), "norm_bound_adaptive"),
                        (dict(flush=FlushRule(continuous=True, deadline_s=None)), "continuous"),
                        (dict(drop_partial=True), "drop_partial"),
                        (dict(flush=FlushRule(deadline_s=30.0)), "flush.deadline_s"),
                        (dict(flush=FlushRule(goal=2, deadline_s=None)), "flush.goal"),
                        (dict(flush=FlushRule(goal=6, deadline_s=None),
                              secure=SecureConfig(enabled=True, neighbours=6)),
                         "secure.neighbours"),
                        # the masked phase would wait for ever for a group that died
                        (dict(flush=FlushRule(deadline_s=None),
                              limits=LimitsConfig(max_task_s=0)), "flush.deadline_s")):
        with pytest.raises(ConfigError, match=re.escape(key)):
            CoordinatorConfig(**{**plain, **change})


def test_a_clip_below_one_is_refused_because_the_weight_rides_in_the_masked_update() -> None:
    # [w * update, w] is clipped as a whole: with clip 0.5 a weight of 1 would arrive as 0.5
    # and every flush would be twice the members' mean
    SecureConfig(enabled=True, clip=1.0)
    SecureConfig(enabled=True, clip=4.0)
    for clip in (0.5, 0.1, float("nan")):
        with pytest.raises(ConfigError, match=r"coordinator\.secure\.clip.*at least 1"):
            SecureConfig(enabled=True, clip=clip)


def test_a_model_with_running_statistics_or_counters_is_refused_in_a_secure_run(
        tmp_path: Path) -> None:
    """BatchNorm's statistics and counters get the plain mean in a plain flush; a secure sum
    would clip them (and, under distributed DP, noise them: negative variances), so such a
    model is refused at start, as are frozen weights under distributed DP."""
    def spec(*kinds: str) -> ParamSpec:
        names = tuple(f"p{i}" for i in range(len(kinds)))
        dtypes = tuple("int64" if k == COUNTER else "float32" for k in kinds)
        return ParamSpec(names, tuple((DIM // len(kinds),) for _ in kinds), dtypes, kinds)

    def service(ddp: bool, *kinds: str) -> CoordinatorService:
        state = tmp_path / f"state-{ddp}-{'-'.join(kinds)}"
        secure = SecureConfig(enabled=True, phase_s=PHASE_S, noise_multiplier=float(ddp))
        config = dataclasses.replace(secure_config(state), secure=secure)
        return CoordinatorService(config, X0, EventLog(None), spec=spec(*kinds))

    for ddp, kinds in ((False, (TRAINABLE, TRAINABLE)), (False, (TRAINABLE, FROZEN)),
                       (True, (TRAINABLE, TRAINABLE))):
        service(ddp, *kinds).close()
    for ddp, kinds, name in ((False, (TRAINABLE, BUFFER), "p1"),
                             (False, (TRAINABLE, COUNTER), "p1"),
                             (True, (FROZEN, TRAINABLE), "p0")):
        with pytest.raises(ConfigError, match=rf"corrupt \({name}: .*GroupNorm"):
            service(ddp, *kinds)


def test_a_group_random_k_density_is_refused_out_of_range_or_without_secure_groups() -> None:
    plain = {"robust": RobustConfig(enabled=False), "norm_bound_adaptive": False}
    CoordinatorConfig(**plain, secure=SecureConfig(enabled=True, density=0.1))
    for density in (0.0, 1.5, float("nan")):
        with pytest.raises(ConfigError, match=r"coordinator\.secure\.density"):
            SecureConfig(enabled=True, density=density)
    with pytest.raises(ConfigError, match=re.escape("set coordinator.secure.enabled = true")):
        CoordinatorConfig(**plain, secure=SecureConfig(density=0.1))


def test_secure_group_settings_without_secure_groups_are_refused() -> None:
    plain = {"robust": RobustConfig(enabled=False), "norm_bound_adaptive": False}
    for key, value in (("modulus_bits", 32), ("quantization_bits", 12), ("clip", 2.0),
                       ("neighbours", 3), ("threshold", 0.6), ("phase_s", 5.0)):
        CoordinatorConfig(**plain, secure=SecureConfig(enabled=True, **{key: value}))
        with pytest.raises(ConfigError, match=rf"coordinator\.secure\.{key}.*enabled = true"):
            CoordinatorConfig(**plain, secure=SecureConfig(**{key: value}))


def test_a_quorum_is_refused_out_of_range_or_without_secure_groups() -> None:
    plain = {"robust": RobustConfig(enabled=False), "norm_bound_adaptive": False}
    CoordinatorConfig(**plain, secure=SecureConfig(enabled=True, quorum=0.75))
    for quorum in (0.0, -0.5, 1.5, float("nan")):
        with pytest.raises(ConfigError, match=r"coordinator\.secure\.quorum"):
            SecureConfig(enabled=True, quorum=quorum)
    with pytest.raises(ConfigError, match=r"coordinator\.secure\.quorum.*enabled = true"):
        CoordinatorConfig(**plain, secure=SecureConfig(quorum=0.75))


def test_over_selection_that_only_makes_groups_too_stale_to_sum_is_refused() -> None:
    """A secure group is the first ``goal`` clients to start: the over-selected tasks form
    later groups, a version stale when they flush, which ``max_staleness = 0`` refuses every
    time. Before, the setting was accepted and each over-selected task refused ``TOO_STALE``
    (and its group lost), round after round."""
    plain = {"robust": RobustConfig(enabled=False), "norm_bound_adaptive": False,
             "secure": SecureConfig(enabled=True)}
    with pytest.raises(ConfigError, match=r"over_selection = 2 with max_staleness = 0"):
        CoordinatorConfig(**plain, flush=FlushRule(goal=4, over_selection=2.0))
    CoordinatorConfig(**plain, flush=FlushRule(goal=4, over_selection=2.0, max_staleness=1))
    CoordinatorConfig(**plain, flush=FlushRule(goal=4))  # over_selection 1
    CoordinatorConfig(robust=RobustConfig(enabled=False), norm_bound_adaptive=False,
                      flush=FlushRule(goal=4, over_selection=2.0))  # plain: the fastest win


def test_an_upload_limit_below_a_masked_update_is_refused_when_the_coordinator_starts(
        tmp_path: Path) -> None:
    """A masked update of 33 values at 24 bits is 99 bytes; with ``inline_bytes`` 0 it rides
    the resumable upload, so a ``max_update_bytes`` of 64 would lose every group at its
    masked phase: the coordinator refuses to start, naming the bytes it needs. Inline, or
    with room, it starts."""
    config = secure_config(tmp_path / "state", inline_bytes=0)
    small = dataclasses.replace(config, limits=dataclasses.replace(config.limits,
                                                                   max_update_bytes=64))
    with pytest.raises(ConfigError, match=r"max_update_bytes: 64 bytes .* at least 99"):
        CoordinatorService(small, X0, EventLog(None))
    for limits in (dataclasses.replace(small.limits, inline_bytes=128),
                   dataclasses.replace(small.limits, max_update_bytes=99)):
        CoordinatorService(dataclasses.replace(small, limits=limits), X0,
                           EventLog(None)).close()


def test_keep_local_under_distributed_dp_is_refused() -> None:
    """Each member noises every coordinate it sends, its kept tensors' zero deltas too: the
    coordinator's copy of them would drift with the noise (an RMS of about 0.5 after four
    flushes, in the run that found it) and a client joining later would start its own from
    it. Without distributed DP, kept tensors stay put, and the setting is accepted."""
    table = {"run": {"name": "kept", "mode": "grpc"},
             "data": {"dataset": "digits", "clients": 4},
             "model": {"name": "mlp", "options": {"hidden": [8]}},
             "client": {"keep_local": ["2."]},
             "coordinator": {"robust": {"enabled": False}, "norm_bound_adaptive": False,
                             "flush": {"goal": 4, "deadline_s": 60.0},
                             "secure": {"enabled": True, "noise_multiplier": 1.0}}}
    with pytest.raises(ConfigError, match=r"keep_local with distributed DP"):
        ExperimentConfig.from_dict(table)
    del table["coordinator"]["secure"]["noise_multiplier"]
    ExperimentConfig.from_dict(table)


def test_distributed_dp_settings_that_cannot_take_effect_are_refused() -> None:
    plain = {"robust": RobustConfig(enabled=False), "norm_bound_adaptive": False}
    CoordinatorConfig(**plain, secure=SecureConfig(enabled=True, noise_multiplier=1.0,
                                                   clip_norm=0.5, max_epsilon=8.0))
    for key, value in (("clip_norm", 0.5), ("granularity_bits", 12), ("delta", 1e-6),
                       ("max_epsilon", 4.0)):  # distributed-DP settings without its noise
        with pytest.raises(ConfigError, match=rf"coordinator\.secure\.{key}"):
            SecureConfig(enabled=True, **{key: value})
    with pytest.raises(ConfigError, match=r"noise_multiplier.*must be >= 0"):
        SecureConfig(enabled=True, noise_multiplier=-1.0)
    with pytest.raises(ConfigError, match=re.escape("set coordinator.secure.enabled = true")):
        CoordinatorConfig(**plain, secure=SecureConfig(noise_multiplier=1.0))
    for change in ({"quantization_bits": 12}, {"clip": 0.5}):  # the noise sets the encoding
        with pytest.raises(ConfigError, match="remove clip and quantization_bits"):
            CoordinatorConfig(**plain, secure=SecureConfig(enabled=True, noise_multiplier=1.0,
                                                           **change))
    # a ring too small for the noised sum is refused when the model's size is known
    small = CoordinatorConfig(**plain, secure=SecureConfig(enabled=True, noise_multiplier=1.0,
                                                           modulus_bits=16))
    with pytest.raises(ConfigError, match="modulus_bits"):
        CoordinatorService(small, X0, EventLog(None)).close()


def test_secure_run_refuses_an_uplink_codec() -> None:
    table = {"run": {"name": "s"},
             "coordinator": {"robust": {"enabled": False}, "norm_bound_adaptive": False,
                             "secure": {"enabled": True}},
             "client": {"compression": "topk"}}
    with pytest.raises(ConfigError, match=r"client\.compression"):
        ExperimentConfig.from_dict(table)


def test_secure_run_refuses_client_privacy_naming_it_and_distributed_dp() -> None:
    """A client privacy stage or DP-SGD reports to a coordinator hook that reads each update:
    refused by the client setting's own name (not as a flush hook the user never listed)."""
    secure = {"robust": {"enabled": False}, "norm_bound_adaptive": False,
              "secure": {"enabled": True}}
    for client, key in (({"privacy": "dp_fedavg"}, "privacy"),
                        ({"trainer": "dp_sgd"}, "trainer")):
        table = {"run": {"name": "s"}, "coordinator": secure, "client": client}
        with pytest.raises(ConfigError, match=rf"client\.{key}: .*noise_multiplier"):
            ExperimentConfig.from_dict(table)


def test_a_client_with_its_own_privacy_stage_is_refused_when_it_joins_a_secure_run(
        tmp_path: Path) -> None:
    """A ``fedlink client`` whose own config clips and noises its updates (``dp_fedavg``)
    joins a secure run: a secure coordinator accounts no client's noise, so the client stops
    at its Join with an error naming the stage, before it trains. Before, nothing checked it
    (only an experiment config holding both sections was refused)."""
    server = CoordinatorServer(secure_config(tmp_path / "state"), X0, EventLog(None),
                               address="127.0.0.1:0")
    pipeline = UpdatePipeline.from_names(privacy="dp_fedavg",
                                         privacy_options={"clip_norm": 1.0})
    trainer = TowardTrainer(np.full(DIM, 0.5, np.float32))

    async def main() -> None:
        async with server:
            session = ClientSession(target_of(server), trainer,
                                    ClientOptions(name="c0", retry=FAST_RETRY), pipeline)
            with pytest.raises(ConfigError, match=r"client privacy 'dp_fedavg' .* secure run"):
                await asyncio.wait_for(session.run(), 30)

    run_async(main(), timeout=40)
    assert trainer.calls == 0


class _NoisyTrainer(TowardTrainer):
    """Stands for a DP-SGD trainer: it accounts its own epsilon (``AccountsPrivacy``)."""

    def epsilon(self) -> float:
        return 0.0


def test_a_client_whose_trainer_accounts_its_own_privacy_is_refused_when_it_joins(
        tmp_path: Path) -> None:
    """A ``fedlink client`` training with DP-SGD joins a secure run: its epsilon would travel
    in update metrics that a secure coordinator never reads, so it stops at its Join, naming
    the trainer, before it trains."""
    server = CoordinatorServer(secure_config(tmp_path / "state"), X0, EventLog(None),
                               address="127.0.0.1:0")
    trainer = _NoisyTrainer(np.full(DIM, 0.5, np.float32))

    async def main() -> None:
        async with server:
            session = ClientSession(target_of(server), trainer,
                                    ClientOptions(name="c0", retry=FAST_RETRY))
            with pytest.raises(ConfigError, match=r"accounts its own privacy \(_NoisyTrainer\)"
                                                  r" cannot be used in a secure run"):
                await asyncio.wait_for(session.run(), 30)

    run_async(main(), timeout=40)
    assert trainer.calls == 0


def test_a_group_with_too_few_deliveries_is_lost_and_its_members_refused(
        tmp_path: Path) -> None:
    config = dataclasses.replace(secure_config(tmp_path / "state"),
                                 flush=FlushRule(goal=3, min_updates=2, deadline_s=None))
    trainers = [TowardTrainer(np.full(DIM, 0.5, np.float32)) for _ in range(3)]
    server = CoordinatorServer(config, X0, EventLog(None), address="127.0.0.1:0")

    async def main() -> list[Any]:
        async with server:
            sessions = [ClientSession(target_of(server), trainers[0],
                                      ClientOptions(name="c0", retry=FAST_RETRY, max_tasks=1))]
            sessions += [DiesBefore(target_of(server), trainers[i],
                                    ClientOptions(name=f"c{i}", retry=FAST_RETRY),
                                    before=MaskedUpload) for i in (1, 2)]
            return await asyncio.wait_for(asyncio.gather(
                *(s.run() for s in sessions), return_exceptions=True), 30)

    results = run_async(main(), timeout=40)
    stats = results[0]
    assert [type(r).__name__ for r in results[1:]] == ["Killed", "Killed"]
    # one masked update of three: a "sum" of one would be that client's update
    assert stats.refused == 1 and "was lost" in stats.refusals[0], stats.refusals
    assert "1 of 3 members delivered" in stats.refusals[0]
    assert server.service.engine.version == 0
    assert server.events.of_kind("flush") == []


def until(condition: Any, timeout: float = 30.0) -> None:
    """Wait, in a trainer's thread, until the coordinator's state meets ``condition``."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the coordinator never got there"
        threading.Event().wait(0.01)


def test_members_exchange_keys_while_they_train_and_the_masked_phase_waits_for_them(
        tmp_path: Path) -> None:
    """A client advertises and shares its keys as its task starts: each trainer here finishes
    only once its group's sharing has closed, and a further ``phase_s`` after that, so no key
    could have been sent after training, and the masked phase, open all that time, waits for
    the first update (``flush.deadline_s`` unset: ``limits.max_task_s``) instead of losing
    the group at ``phase_s``."""
    config = dataclasses.replace(secure_config(tmp_path / "state"),
                                 flush=FlushRule(goal=3, min_updates=2, deadline_s=None))
    server = CoordinatorServer(config, X0, EventLog(None), address="127.0.0.1:0")
    closed: dict[int, float] = {}

    def after_sharing(call: int) -> None:
        until(lambda: SHARE in closed)
        until(lambda: time.monotonic() - closed[SHARE] > PHASE_S)

    trainers = [TowardTrainer(np.full(DIM, 0.5, np.float32), before_train=after_sharing)
                for _ in range(3)]

    async def main() -> list[Any]:
        async with server:
            desk = server.service.secure_calls.desk
            assert desk is not None
            desk.on_phase = lambda group, phase: closed.setdefault(phase, time.monotonic())
            sessions = [ClientSession(target_of(server), trainer,
                                      ClientOptions(name=f"c{i}", retry=FAST_RETRY))
                        for i, trainer in enumerate(trainers)]
            return await asyncio.wait_for(asyncio.gather(*(s.run() for s in sessions)), 60)

    stats = run_async(main(), timeout=80)
    assert all(s.accepted == 1 and s.refused == 0 for s in stats), stats
    [flush] = server.events.of_kind("flush")
    assert flush.num_updates == 3 and server.events.of_kind("secure_group_lost") == []
    np.testing.assert_allclose(server.service.engine.model, 0.25, atol=1e-4)


class SharesWhen(ClientSession):
    """A client whose ``n``-th ``SecureShare`` (from 0) waits until ``conditions[n]()``."""

    def __init__(self, *args: Any, conditions: dict[int, Any], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conditions = conditions
        self.shares = 0

    async def _share_keys(self, secure: SecureDelivery) -> None:
        condition = self.conditions.get(self.shares, lambda: True)
        self.shares += 1
        while not condition():  # evidence from the in-process coordinator, polled
            await asyncio.sleep(0.01)
        await super()._share_keys(secure)


def test_a_member_whose_keys_came_late_joins_the_next_group_with_fresh_keys(
        tmp_path: Path) -> None:
    """``quorum = 0.75``: a group of 4 closes its sharing without c3, which is still
    training. c3's late ``SecureShare`` is refused ``NEW_KEYS``, not its task: it advertises
    fresh keys into the next group while it trains, and its update, one version stale, is in
    that group's sum; no ``update_refused`` event, no training lost. (In the second group the
    others share only after c3, so that the quorum leaves out one of them, not c3.)"""
    config = dataclasses.replace(
        secure_config(tmp_path / "state"), rounds=2,
        flush=FlushRule(goal=4, min_updates=2, deadline_s=None, max_staleness=2),
        secure=SecureConfig(enabled=True, phase_s=600.0, quorum=0.75))
    server = CoordinatorServer(config, X0, EventLog(None), address="127.0.0.1:0")
    shared: set[int] = set()  # groups whose sharing closed
    rejoined = threading.Event()

    def until_rejoined(call: int) -> None:
        if call == 0:  # c3's first task trains only once its fresh keys are in group 2
            until(rejoined.is_set)

    trainers = [TowardTrainer(np.full(DIM, 0.5, np.float32)) for _ in range(3)]
    trainers.append(TowardTrainer(np.full(DIM, 0.5, np.float32), before_train=until_rejoined))

    async def main() -> tuple[list[Any], str]:
        async with server:
            desk = server.service.secure_calls.desk
            assert desk is not None

            def phase_closed(group: SecureGroup, phase: int) -> None:
                if phase == SHARE:
                    shared.add(group.number)
                if group.number == 2 and phase == ADVERTISE:
                    rejoined.set()  # group 2's roster is full: c3's fresh keys are in it

            def late_shared_in_group_2() -> bool:
                group = desk.group
                member = None if group is None else group.members.get(late.client_id)
                return (group is not None and group.number == 2 and member is not None
                        and member.index in group.sum.sharers)

            desk.on_phase = phase_closed
            late = SharesWhen(target_of(server), trainers[3],
                              ClientOptions(name="c3", retry=FAST_RETRY),
                              conditions={0: lambda: 1 in shared})
            sessions = [SharesWhen(target_of(server), trainers[i],
                                   ClientOptions(name=f"c{i}", retry=FAST_RETRY),
                                   conditions={1: late_shared_in_group_2})
                        for i in range(3)] + [late]
            done = await asyncio.wait_for(asyncio.gather(*(s.run() for s in sessions)), 60)
            return done, late.client_id

    stats, late_id = run_async(main(), timeout=80)
    assert stats[3].accepted == 1 and stats[3].refused == 0, stats[3]
    first, second = server.events.of_kind("flush")
    assert (first.num_updates, second.num_updates) == (3, 3)
    assert server.events.of_kind("update_refused") == []
    [late_update] = [e for e in server.events.of_kind("update_accepted")
                     if e.client_id == late_id]
    assert (late_update.base_version, late_update.staleness) == (0, 1)


def test_a_retried_advertise_gets_the_same_answer_and_a_late_client_joins_the_next_group(
        tmp_path: Path) -> None:
    config = dataclasses.replace(secure_config(tmp_path / "state"), flush=FlushRule(
        goal=3, min_updates=2, deadline_s=None, over_selection=1.5, max_staleness=1))

    async def main() -> None:
        service = CoordinatorService(config, X0, EventLog(None))
        try:
            adverts = []
            for i in range(4):  # a cohort of 4 for a group of 3 (over-selection)
                joined = await service.join(JoinRequest(f"c{i}", num_examples=10))
                task = await service.get_task(GetTaskRequest(joined.client_id, -1))
                assert isinstance(task, Task)
                adverts.append(SecureAdvertiseRequest(joined.client_id, task.task_id,
                                                      bytes([i]) * 32, bytes([i + 8]) * 32))
            first = asyncio.ensure_future(service.secure_calls.advertise(adverts[0]))
            middle = asyncio.ensure_future(service.secure_calls.advertise(adverts[1]))
            last = await service.secure_calls.advertise(adverts[2])  # the group is full: closes
            assert (await first).members == (await middle).members == last.members
            assert [m.index for m in last.members] == [0, 1, 2]
            assert last.weight == 1.0  # trained on the current version: not discounted
            again = await service.secure_calls.advertise(adverts[0])  # a retry, same answer
            assert again == await first
            # the fourth finished too late for that roster: it starts the next group (its
            # work is not thrown away), answered once that group's roster closes
            late = asyncio.ensure_future(service.secure_calls.advertise(adverts[3]))
            desk = service.secure
            assert desk is not None
            await asyncio.sleep(0)
            group = desk.group
            assert group is not None and group.number == last.round_id + 1
            assert list(group.members) == [adverts[3].client_id]
            late.cancel()
        finally:
            service.close()

    run_async(main(), timeout=20)


class StaysJoined(ClientSession):
    """A client whose process lives on after the run: it never leaves (its id stays known)."""

    async def _leave(self, reason: str) -> None:
        return None


def _group_server(tmp_path: Path, rounds: int, members: int) -> CoordinatorServer:
    """A secure run of groups of ``members`` clients."""
    config = dataclasses.replace(secure_config(tmp_path / "state"), rounds=rounds,
                                 flush=FlushRule(goal=members, min_updates=2, deadline_s=None))
    return CoordinatorServer(config, X0, EventLog(None), address="127.0.0.1:0")


def _staying(server: CoordinatorServer, members: int, late: bool = False) -> list[StaysJoined]:
    """``members`` clients of the started ``server`` that stay joined; ``late``: the last one
    answers its first unmask only once its group flushed (``LateToUnmask``)."""
    kinds = [StaysJoined] * (members - 1) + [LateToUnmask if late else StaysJoined]
    extra = {"flushed": lambda: server.events.count("flush") >= 1} if late else {}
    return [kind(target_of(server), TowardTrainer(np.full(DIM, 0.5, np.float32)),
                 ClientOptions(name=f"c{i}", retry=FAST_RETRY),
                 **(extra if kind is LateToUnmask else {}))
            for i, kind in enumerate(kinds)]


def test_a_share_retried_once_its_group_flushed_is_refused_as_closed(tmp_path: Path) -> None:
    """A member whose share reply was lost may ask again after its group flushed without it:
    the shares are gone, so it is told its task is closed (never an internal error)."""
    server = _group_server(tmp_path, rounds=1, members=3)

    async def main() -> None:
        async with server:
            sessions = _staying(server, 3)
            await asyncio.wait_for(asyncio.gather(*(s.run() for s in sessions)), 30)
            group = server.service.secure.group if server.service.secure else None
            assert group is not None and group.flushed_version == 1
            client_id = sessions[0].client_id
            member = group.members[client_id]
            with pytest.raises(UpdateRefused, match="its shares are no longer held") as err:
                await server.service.secure_calls.share(
                    SecureShareRequest(client_id, member.task_id))
            assert err.value.reason is RefusalCode.TASK_CLOSED

    run_async(main(), timeout=40)


class LateToUnmask(StaysJoined):
    """A client whose first unmask answer waits until its group has flushed without it."""

    def __init__(self, *args: Any, flushed: Callable[[], bool], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.flushed = flushed
        self.held = False

    async def _unmask(self, action: Any, work: Any, protocol: Any) -> Any:
        if not self.held:
            self.held = True
            await wait_until(self.flushed, timeout=20, what="the group's flush")
        return await super()._unmask(action, work, protocol)


def test_an_unmask_answer_after_its_groups_flush_is_counted_in_bytes_up(
        tmp_path: Path) -> None:
    """The group unmasks once enough shares are in; the last member's answer comes after the
    flush, when its ``update_accepted`` is written. Its bytes are recorded apart
    (``secure_answer_late``, once) and the run's ``bytes_up`` counts them: before, they were
    in no event."""
    server = _group_server(tmp_path, rounds=2, members=4)

    async def main() -> None:
        async with server:
            sessions = _staying(server, 4, late=True)
            await asyncio.wait_for(asyncio.gather(*(s.run() for s in sessions)), 40)

    run_async(main(), timeout=50)
    events = server.events.events
    (late,) = [e for e in events if e.kind == "secure_answer_late"]
    assert late["client_id"] == next(e["client_id"] for e in events
                                     if e.kind == "client_joined" and e["name"] == "c3")
    assert late["group"] == 1 and late["bytes_up"] == 4 + 40 * 3  # a share per neighbour
    accepted = [e for e in events if e.kind in ("update_accepted", "update_refused")]
    assert summarize(events, {})["bytes_up"] == sum(e["bytes_up"] for e in accepted) \
        + late["bytes_up"]


class HeldBeforeSharing(ClientSession):
    """A client that trains and advertises its keys, then holds them until ``release``."""

    def __init__(self, *args: Any, release: asyncio.Event, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.release = release

    async def _share_keys(self, secure: SecureDelivery) -> None:
        await self.release.wait()
        await super()._share_keys(secure)


QUORUM_CASES = {
    "plain": {},
    # distributed DP (almost no noise) under group random-k: the sum of three carries three
    # noise shares of four and is accounted so
    "ddp_randk": {"density": 0.5, "noise_multiplier": 1e-4, "clip_norm": 100.0},
}


@pytest.mark.parametrize("case", list(QUORUM_CASES))
def test_a_quorum_closes_the_share_and_masked_phases_without_the_straggler(
        tmp_path: Path, case: str) -> None:
    """``quorum = 0.75``: a group of 4 flushes the sum of the 3 that shared while the fourth
    still holds its keys (the phases' 600 s deadline never comes), and the fourth's update,
    moving the other way, is not in the model; its keys come too late (it has trained by then:
    it advertises fresh keys with the update it trained, and finds its task closed with the
    run)."""
    config = dataclasses.replace(
        secure_config(tmp_path / "state"), rounds=1, seed=5,
        flush=FlushRule(goal=4, min_updates=2, deadline_s=None),
        secure=SecureConfig(enabled=True, phase_s=600.0, quorum=0.75, **QUORUM_CASES[case]))
    trainers = [TowardTrainer(np.full(DIM, 0.5 if i < 3 else -0.5, np.float32))
                for i in range(4)]
    server = CoordinatorServer(config, X0, EventLog(None), address="127.0.0.1:0")

    async def main() -> tuple[list[Any], Any]:
        release = asyncio.Event()
        async with server:
            straggler = asyncio.ensure_future(HeldBeforeSharing(
                target_of(server), trainers[3], ClientOptions(name="c3", retry=FAST_RETRY),
                release=release).run())
            sessions = [ClientSession(target_of(server), trainers[i],
                                      ClientOptions(name=f"c{i}", retry=FAST_RETRY))
                        for i in range(3)]
            # the three finish the run (one version) while the fourth holds its keys
            done = await asyncio.wait_for(asyncio.gather(*(s.run() for s in sessions)), 30)
            assert not straggler.done()
            release.set()
            return done, await asyncio.wait_for(straggler, 30)

    done, late = run_async(main(), timeout=70)
    assert all(stats.accepted == 1 for stats in done)
    [flush] = server.events.of_kind("flush")
    assert flush.num_updates == 3
    model = server.service.engine.model
    kept = group_indices(config.secure.density, 5, 1, DIM)
    kept = np.arange(DIM) if kept is None else kept
    # the three's mean (the fourth's would move it to 0.125), up to quantization or the noise
    np.testing.assert_allclose(model[kept], 0.25, atol=0.05 if config.secure.ddp else 1e-4)
    assert not np.delete(model, kept).any()
    assert late.accepted == 0 and late.refused == 1, late.refusals
    # it had trained when it heard its group went on without its keys: it kept its update for
    # the next group, and the run's end closed its task
    assert "is no longer open" in late.refusals[0]
    if config.secure.ddp:
        privacy = flush["privacy"]
        assert privacy["mode"] == "user_distributed" and privacy["sums_short_of_shares"] == 1


class GarblesItsFirstShares(ClientSession):
    """A client whose first shares arrive garbled (a buggy or hostile neighbour): zeroed
    ciphertexts of the right size, which the coordinator cannot tell from good ones."""

    garbled = False

    async def _share_keys(self, secure: SecureDelivery) -> None:
        request = secure.share()
        if not self.garbled:
            self.garbled = True
            request = dataclasses.replace(request, shares=tuple(
                dataclasses.replace(s, ciphertext=bytes(len(s.ciphertext)))
                for s in request.shares))
        secure.shared(await self._secure_call("Share", request, timed=False))


def test_members_handed_a_share_that_does_not_decrypt_leave_the_group_and_go_on(
        tmp_path: Path) -> None:
    """c3's shares of its first task are garbled. Its neighbours cannot decrypt them: each
    leaves that group (counted as a failed task) and checks in again for a later one, instead
    of ending its session on the error, and the run makes its version from the later group."""
    config = dataclasses.replace(secure_config(tmp_path / "state"),
                                 flush=FlushRule(goal=4, min_updates=2, deadline_s=None))
    server = CoordinatorServer(config, X0, EventLog(None), address="127.0.0.1:0")
    trainers = [TowardTrainer(np.full(DIM, 0.5, np.float32)) for _ in range(4)]

    async def main() -> list[Any]:
        async with server:
            sessions = [ClientSession(target_of(server), trainers[i],
                                      ClientOptions(name=f"c{i}", retry=FAST_RETRY))
                        for i in range(3)]
            sessions.append(GarblesItsFirstShares(target_of(server), trainers[3],
                                                  ClientOptions(name="c3", retry=FAST_RETRY)))
            return await asyncio.wait_for(asyncio.gather(*(s.run() for s in sessions)), 60)

    stats = run_async(main(), timeout=80)
    assert all(s.finished == "completed 1 rounds" for s in stats), stats
    for honest in stats[:3]:
        assert (honest.failed, honest.accepted) == (1, 1), honest
    [flush] = server.events.of_kind("flush")  # c3 makes it only if it rejoins in time
    assert flush.num_updates >= 3
    assert server.events.of_kind("secure_group_lost")[0].group == 1


def test_the_secure_example_config_loads() -> None:
    path = Path(__file__).resolve().parents[2] / "examples" / "digits_secure.toml"
    config = ExperimentConfig.from_dict(load_toml(path))
    assert config.coordinator.secure.enabled and config.coordinator.secagg().max_clients == 8


CHILD = """
import asyncio, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from conftest import TowardTrainer
from fedlink.client import ClientOptions, ClientSession, RetryPolicy
target = np.array([float(v) for v in sys.argv[4].split(",")], dtype=np.float32)
session = ClientSession(sys.argv[2], TowardTrainer(target, examples=10),
                        ClientOptions(name=sys.argv[3], retry=RetryPolicy(
                            initial_backoff_s=0.01, max_backoff_s=0.05, max_attempts=5)))
stats = asyncio.run(session.run())
print("accepted", stats.accepted, flush=True)
"""


def test_client_processes_sigkilled_between_phases_are_unmasked(tmp_path: Path) -> None:
    """Five client processes; one is SIGKILLed the instant the coordinator has its shares,
    one the instant it has its masked update (each before it hears the answer): the round
    completes with the four that delivered, their mean within the quantization, and the
    coordinator's memory, event log and state dir hold no individual update."""
    rng = np.random.default_rng(11)
    targets = [rng.uniform(-0.8, 0.8, DIM).astype(np.float32) for _ in range(CLIENTS)]
    deltas = [TowardTrainer(t).step(X0.astype(np.float64)) for t in targets]
    # c1's death after sharing is noticed only at the masked phase's deadline: long enough
    # that the four live processes deliver before it on a loaded machine (1.5 s was not)
    config = dataclasses.replace(secure_config(tmp_path / "state"),
                                 secure=SecureConfig(enabled=True, phase_s=10.0))
    step = config.secagg().step
    server = CoordinatorServer(config, X0, EventLog(tmp_path / "events.jsonl"),
                               address="127.0.0.1:0")
    tests_dir = str(Path(__file__).resolve().parents[1])
    procs: dict[str, asyncio.subprocess.Process] = {}
    killed: list[str] = []

    async def main() -> list[int | None]:
        async with server:
            desk = server.service.secure
            assert desk is not None
            names = server.service.registry.name_of
            share, masked = desk.record_share, desk.record_masked

            def kill_after(record: Any, name: str) -> Any:
                def recorded(request: Any, *rest: Any) -> Any:
                    result = record(request, *rest)
                    if names(request.client_id) == name and name not in killed:
                        procs[name].kill()  # SIGKILL: its answer never reaches it
                        killed.append(name)
                    return result
                return recorded

            desk.record_share = kill_after(share, "c1")  # type: ignore[method-assign]
            desk.record_masked = kill_after(masked, "c3")  # type: ignore[method-assign]
            for i in range(CLIENTS):
                procs[f"c{i}"] = await asyncio.create_subprocess_exec(
                    sys.executable, "-c", CHILD, tests_dir, target_of(server), f"c{i}",
                    ",".join(repr(float(v)) for v in targets[i]),
                    stdout=(tmp_path / f"c{i}.out").open("wb"),
                    stderr=(tmp_path / f"c{i}.err").open("wb"))
            codes = [await asyncio.wait_for(p.wait(), 60) for p in procs.values()]
            await asyncio.wait_for(server.wait_finished(), 20)
            found = [o for o in held_objects(server.service) if leaks(o, deltas, step)]
            assert found == []
            return codes

    codes = run_async(main(), timeout=85)
    assert killed == ["c1", "c3"]
    assert codes[1] == codes[3] == -signal.SIGKILL
    assert codes[0] == codes[2] == codes[4] == 0
    for i in (0, 2, 4):
        assert (tmp_path / f"c{i}.out").read_text().split() == ["accepted", "1"]
    engine = server.service.engine
    assert engine.version == 1
    expected = X0 + np.mean([deltas[i] for i in (0, 2, 3, 4)], axis=0)
    assert np.allclose(engine.model, expected, atol=4 * step)
    for path in (p for p in tmp_path.rglob("*") if p.is_file()):
        assert not leaks(path.read_bytes(), deltas, step), path


class CountsAdvertisements(ClientSession):
    """A client that counts its ``SecureAdvertise`` calls (each with fresh keys)."""

    advertised = 0

    async def _advertise(self, secure: SecureDelivery) -> None:
        self.advertised += 1
        await super()._advertise(secure)


def test_a_member_waiting_for_a_roster_short_of_members_keeps_the_update_it_trained(
        tmp_path: Path) -> None:
    """Two clients for a group of 3: they train at once, then their roster, short of members,
    waits; each call is answered ``NEW_KEYS`` after ``phase_s`` and its client advertises
    fresh keys again, keeping the update it trained. Before, it dropped its task at each such
    answer and trained it again (and once past the task's deadline, completed no step, which
    the secure sum weighs as any other update). Once a third client comes, the group flushes
    the three updates, each trained once."""
    config = dataclasses.replace(
        secure_config(tmp_path / "state"), rounds=1,
        flush=FlushRule(goal=3, min_updates=2, deadline_s=None),
        secure=SecureConfig(enabled=True, phase_s=PHASE_S))
    trainers = [TowardTrainer(np.full(DIM, 0.5, np.float32)) for _ in range(3)]
    server = CoordinatorServer(config, X0, EventLog(None), address="127.0.0.1:0")

    async def main() -> list[Any]:
        async with server:
            early = [CountsAdvertisements(target_of(server), trainers[i],
                                          ClientOptions(name=f"c{i}", retry=FAST_RETRY))
                     for i in range(2)]
            runs = [asyncio.ensure_future(s.run()) for s in early]
            while not all(s.advertised >= 3 and t.calls
                          for s, t in zip(early, trainers[:2], strict=True)):
                await asyncio.sleep(0.01)  # trained, and asked to advertise again twice
            late = ClientSession(target_of(server), trainers[2],
                                 ClientOptions(name="c2", retry=FAST_RETRY))
            return await asyncio.wait_for(asyncio.gather(*runs, late.run()), 30)

    done = run_async(main(), timeout=60)
    assert [t.calls for t in trainers] == [1, 1, 1]
    assert all(stats.accepted == 1 and stats.refused == 0 for stats in done), done
    [flush] = server.events.of_kind("flush")
    assert flush.num_updates == 3
    assert server.events.of_kind("secure_group_lost") == []
    np.testing.assert_allclose(server.service.engine.model, 0.25, atol=1e-4)
