"""The ``sync`` preset with every client on time is FedAvg, exactly.

Five digits clients with ``TorchTrainer`` take part in three rounds through a real coordinator
on loopback (gRPC, uploads, deltas, the round engine). The test then computes FedAvg itself,
in process and in float64: the same trainers, given the same plans (the per-task seeds each
``ClientSession`` drew, read from what its trainer was asked to do), from the same initial
model. The two final models must agree to 1e-6: with ``[coordinator.robust] trim = 0`` the
plain weighted mean (honest clients of equal sizes: the flush guard caps, clips and drops
nothing), and by default FedAvg with the guard's weighted mean of each coordinate's values but
the highest and the lowest (``floor(0.2 x 5)`` = 1 update trimmed at each end).
"""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
from conftest import CoordinatorFactory, gather_bounded, run_async, target_of

from fedlink.aggregate import TrimmedMean
from fedlink.aggregate.flushguard import RobustConfig
from fedlink.client import ClientOptions, ClientSession, TrainPlan, TrainResult
from fedlink.client.torch_trainer import TorchTrainer
from fedlink.coordinator import CoordinatorConfig, FlushRule, LimitsConfig, TrainingConfig
from fedlink.data import load_federated
from fedlink.models import build_model
from fedlink.params import to_vector

pytestmark = pytest.mark.timeout(120)

CLIENTS, ROUNDS, SEED = 5, 3, 11


class Recording:
    """A trainer that notes the parameters and plan of every task it trains."""

    def __init__(self, trainer: TorchTrainer) -> None:
        self.trainer = trainer
        self.calls: list[tuple[np.ndarray, TrainPlan]] = []
        self._lock = threading.Lock()

    def num_examples(self) -> int:
        return self.trainer.num_examples()

    def train(self, params: np.ndarray, plan: TrainPlan) -> TrainResult:
        with self._lock:
            self.calls.append((params.copy(), plan))
        return self.trainer.train(params, plan)


def trainers() -> tuple[list[TorchTrainer], np.ndarray]:
    data = load_federated("digits", CLIENTS, SEED, "iid")

    def model() -> object:
        return build_model("mlp", data.num_features, data.num_classes, seed=SEED)

    built = [TorchTrainer(model(), data.clients[i], seed=SEED * 7919 + i)  # type: ignore[arg-type]
             for i in range(CLIENTS)]
    return built, to_vector(model())  # type: ignore[arg-type]


def plain_fedavg(initial: np.ndarray, plans: list[list[TrainPlan]],
                 trim: float = 0.0) -> np.ndarray:
    """FedAvg by hand: every client trains from the global model; weights = examples; with
    ``trim``, each coordinate's ``trim`` of the updates at each end left out, ranked by
    direction (``delta / ||delta||``)."""
    fresh, _ = trainers()
    model = initial.copy()
    for round_ in range(ROUNDS):
        results = [t.train(model, plans[i][round_]) for i, t in enumerate(fresh)]
        if trim:
            trimmed = TrimmedMean(trim, weighted=True, trim_by_count=True)
            for r in results:
                delta = (r.params.astype(np.float64) - model).astype(np.float32)
                trimmed.keep(delta, r.num_examples, float(np.linalg.norm(delta)))
            model = (model + trimmed.mean()).astype(np.float32)
            continue
        total = sum(r.num_examples for r in results)
        step = sum(r.num_examples * (r.params.astype(np.float64) - model) for r in results)
        model = (model + step / total).astype(np.float32)
    return model


@pytest.mark.parametrize("trim", [0.0, None], ids=["plain", "default"])
def test_sync_preset_equals_plain_fedavg(coordinator: CoordinatorFactory,
                                         trim: float | None) -> None:
    built, initial = trainers()
    recording = [Recording(t) for t in built]
    config = CoordinatorConfig(
        rounds=ROUNDS, flush=FlushRule.from_preset("sync", goal=CLIENTS),
        training=TrainingConfig(local_epochs=1, batch_size=16, learning_rate=0.1),
        limits=LimitsConfig(long_poll_s=2.0, retry_after_s=0.05),
        robust=RobustConfig(trim=trim))

    async def scenario() -> np.ndarray:
        async with coordinator(config, initial) as server:
            sessions = [ClientSession(target_of(server), r, ClientOptions(name=f"d{i}", seed=i),
                                      inline_training=True)
                        for i, r in enumerate(recording)]
            await gather_bounded(*(s.run() for s in sessions), timeout=90)
            await asyncio.wait_for(server.wait_finished(), 10)
            assert server.service.engine.version == ROUNDS
            assert not [e for e in server.events.events if e["kind"] == "update_limited"]
            return server.service.engine.model.copy()

    served = run_async(scenario(), timeout=100)
    assert all(len(r.calls) == ROUNDS for r in recording)
    assert all(plan.deadline is None for r in recording for _, plan in r.calls)
    plans = [[plan for _, plan in r.calls] for r in recording]
    assert len({p.seed for row in plans for p in row}) > 1  # clients really drew seeds
    expected = plain_fedavg(initial, plans, 0.2 if trim is None else trim)
    diff = float(np.abs(served - expected).max())
    assert diff <= 1e-6, diff
    assert float(np.abs(served - initial).max()) > 1e-2  # and training moved the model
