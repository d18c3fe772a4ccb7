"""A client never trains another run's model: ``WrongRun`` when the coordinator it reaches
serves a model of another size, or, joining again, another run than the one it joined."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

import numpy as np
import pytest
from conftest import TowardTrainer, fixed_port, run_async, wait_until

from fedlink.aggregate.flushguard import RobustConfig
from fedlink.client import ClientOptions, ClientSession, RetryPolicy
from fedlink.client.base import TrainPlan, TrainResult
from fedlink.coordinator import CoordinatorConfig, CoordinatorServer, FlushRule, LimitsConfig
from fedlink.errors import WrongRun
from fedlink.metrics import EventLog
from fedlink.params.base import ParamSpec

pytestmark = pytest.mark.timeout(90)

CONFIG = CoordinatorConfig(run_name="a", rounds=3, flush=FlushRule(goal=1, deadline_s=None),
                           limits=LimitsConfig(chunk_bytes=100, long_poll_s=2.0,
                                               retry_after_s=0.05),
                           robust=RobustConfig(enabled=False))
PATIENT = RetryPolicy(initial_backoff_s=0.02, max_backoff_s=0.2, max_attempts=100)


class SizedTrainer(TowardTrainer):
    """A numpy trainer that says its model's layout (``spec``), as ``TorchTrainer`` does."""

    def __init__(self, size: int) -> None:
        super().__init__(np.ones(size, np.float32))
        self.spec = ParamSpec(("w",), ((size,),), ("float32",))

    def train(self, params: np.ndarray, plan: TrainPlan) -> TrainResult:
        assert params.size == self.spec.size  # never reached with another run's model
        return super().train(params, plan)


def test_a_trainer_of_another_model_size_is_refused_at_join() -> None:
    trainer = SizedTrainer(32)

    async def main() -> None:
        async with CoordinatorServer(CONFIG, np.zeros(64, np.float32), EventLog(None),
                                     address="127.0.0.1:0") as server:
            session = ClientSession(f"127.0.0.1:{server.port}", trainer,
                                    ClientOptions(name="dev", retry=PATIENT))
            with pytest.raises(WrongRun, match=r"runs 'a' with a model of 64 parameters; "
                                               r"this client's trainer holds 32"):
                await session.run()
            assert server.service.engine.version == 0

    run_async(main())
    assert trainer.calls == 0


def test_a_client_refuses_another_run_that_took_over_its_coordinators_address() -> None:
    """Run "a" stops while the client trains; run "b", of another model, starts on the same
    address: the client, told it is unknown there, joins again and stops with ``WrongRun``
    instead of training b's model with a's shape (a shape error deep in its trainer)."""
    release = threading.Event()
    trainer = TowardTrainer(np.ones(64, np.float32),
                            before_train=lambda call: release.wait(30) if call == 0 else None)
    port = fixed_port()
    address = f"127.0.0.1:{port}"

    async def main() -> None:
        run_a = CoordinatorServer(CONFIG, np.zeros(64, np.float32), EventLog(None),
                                  address=address)
        await run_a.start()
        session = ClientSession(address, trainer, ClientOptions(name="dev", retry=PATIENT))
        running = asyncio.create_task(session.run())
        await wait_until(lambda: trainer.calls == 1, what="the first task's training")
        await run_a.stop()
        run_b = CoordinatorServer(dataclasses.replace(CONFIG, run_name="b"),
                                  np.zeros(32, np.float32), EventLog(None), address=address)
        await run_b.start()
        try:
            release.set()
            with pytest.raises(WrongRun, match=r"now runs 'b' \(32 parameters\), not 'a' "
                                               r"\(64 parameters\)"):
                await running
            assert run_b.service.engine.version == 0
        finally:
            release.set()
            await run_b.stop()

    run_async(main(), timeout=60)
    assert trainer.calls == 1  # nothing trained on run b's model
