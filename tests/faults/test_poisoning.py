"""Model poisoning: with norm bounding on, a huge update moves the model only as far as allowed.

Two clients on a real coordinator (loopback, raw gRPC) share one flush: an honest one sends a
small delta ``h``, an attacker one of L2 norm 1e6. With ``norm_bound = B`` each update is
clipped to norm ``B`` before the weighted average (FedAvg, server learning rate 1), so::

    x1 - x0 = w_h * clip(h) + w_a * clip(a),    w = num_examples / total

and the attacker's pull on the model, ``||x1 - x0 - w_h * clip(h)||``, is at most ``w_a * B``.
The flush guard (on by default) counts each claim at most 2 x the flush's lower-median claim,
so the attacker's 90 examples count as 20 beside the honest 10; ``trim = 0`` keeps the plain
weighted mean this arithmetic is about.
"""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from conftest import CoordinatorFactory, run_async

from fedlink.aggregate.flushguard import RobustConfig
from fedlink.compress import get_codec
from fedlink.coordinator import CoordinatorConfig, FlushRule
from fedlink.messages import CommitRequest
from fedlink.proto.v1 import coordinator_pb2 as pb
from fedlink.proto.v1 import coordinator_pb2_grpc as pb_grpc
from fedlink.wire import pack, to_proto

pytestmark = pytest.mark.timeout(60)

DIM = 64
BOUND = 0.5
FP32 = get_codec("fp32")


def clip(vector: np.ndarray, bound: float) -> np.ndarray:
    norm = float(np.linalg.norm(vector.astype(np.float64)))
    return vector.astype(np.float64) * min(1.0, bound / norm) if norm > 0 else vector


async def deliver(stub: pb_grpc.CoordinatorStub, name: str, examples: int,
                  delta: np.ndarray) -> None:
    client_id = (await stub.Join(pb.JoinRequest(client_name=name, num_examples=examples),
                                 timeout=10)).client_id
    task = (await stub.GetTask(pb.GetTaskRequest(client_id=client_id, held_version=-1),
                               timeout=10)).task
    payload = pack(delta, FP32)
    chunk = pb.UploadChunk(client_id=client_id, upload_id=f"{name}-1", offset=0,
                           data=payload.data)
    await stub.Upload(iter([chunk]), timeout=10)
    await stub.Commit(to_proto(CommitRequest(
        client_id=client_id, upload_id=f"{name}-1", task_id=task.task_id,
        base_version=task.model_version, num_examples=examples, steps_completed=1,
        steps_planned=1, update=payload.header)), timeout=10)


@pytest.mark.parametrize(("honest_examples", "attacker_examples"), [(10, 10), (10, 90)])
def test_norm_bound_limits_a_poisoned_update(coordinator: CoordinatorFactory,
                                             honest_examples: int,
                                             attacker_examples: int) -> None:
    rng = np.random.default_rng(7)
    x0 = rng.normal(size=DIM).astype(np.float32)
    honest = (0.01 * rng.normal(size=DIM)).astype(np.float32)
    attack = rng.normal(size=DIM)
    attack = (attack / np.linalg.norm(attack) * 1e6).astype(np.float32)
    assert np.linalg.norm(attack.astype(np.float64)) == pytest.approx(1e6, rel=1e-5)
    config = CoordinatorConfig(rounds=1, norm_bound=BOUND, robust=RobustConfig(trim=0.0),
                               flush=FlushRule(goal=2, deadline_s=None))

    async def scenario() -> np.ndarray:
        async with coordinator(config, x0) as server:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                stub = pb_grpc.CoordinatorStub(channel)
                await deliver(stub, "honest", honest_examples, honest)
                await deliver(stub, "attacker", attacker_examples, attack)
            await server.wait_finished()
            return server.service.engine.model.astype(np.float64)

    x1 = run_async(scenario())
    capped = min(attacker_examples, 2 * min(honest_examples, attacker_examples))
    total = honest_examples + capped
    w_honest, w_attacker = honest_examples / total, capped / total
    moved = x1 - x0.astype(np.float64)
    pull = moved - w_honest * clip(honest, BOUND)
    tolerance = 1e-5  # float32 arithmetic on the coordinator
    assert np.linalg.norm(moved) <= BOUND + tolerance
    assert np.linalg.norm(pull) <= w_attacker * BOUND + tolerance
    # and the bound is what limited it: the attacker did pull the model by about that much
    assert np.linalg.norm(pull) == pytest.approx(w_attacker * BOUND, rel=1e-3)
