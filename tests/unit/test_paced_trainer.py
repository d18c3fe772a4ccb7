"""``PacedTrainer``: a simulated client trains at a device's pace (``[run] device_step_s``),
whatever this machine's, and stops at its task's deadline with the steps that fit."""

from __future__ import annotations

import numpy as np
import pytest

from fedlink.client import TrainPlan, TrainResult
from fedlink.clock import ManualClock
from fedlink.errors import ConfigError
from fedlink.sim.stragglers import PacedTrainer

EXAMPLES = 70


class _Instant:
    """Trains in no time on the clock: one step adds 1 to every parameter."""

    def __init__(self) -> None:
        self.plans: list[TrainPlan] = []

    def num_examples(self) -> int:
        return EXAMPLES

    def train(self, params: np.ndarray, plan: TrainPlan) -> TrainResult:
        self.plans.append(plan)
        steps = plan.local_steps or plan.local_epochs * -(-EXAMPLES // plan.batch_size)
        return TrainResult(params + steps, EXAMPLES, steps, steps, {"train_seconds": 0.001})

    def evaluate(self, params: np.ndarray) -> dict[str, float]:
        return {"accuracy": 0.5}


def _paced(step_s: float = 0.5) -> tuple[PacedTrainer, _Instant, ManualClock]:
    inner, clock = _Instant(), ManualClock(start=100.0)
    return PacedTrainer(inner, step_s, batch_size=32, clock=clock), inner, clock


def test_each_step_takes_the_devices_time() -> None:
    paced, _, clock = _paced()
    result = paced.train(np.zeros(2, np.float32), TrainPlan(local_steps=4))
    assert clock.now() == pytest.approx(102.0)  # 4 steps of 0.5 s
    assert (result.steps_completed, result.steps_planned) == (4, 4)
    assert result.metrics["train_seconds"] == pytest.approx(2.0)  # the device's, not ours
    paced.train(np.zeros(2, np.float32), TrainPlan(local_epochs=2, batch_size=32))
    assert clock.now() == pytest.approx(105.0)  # 2 epochs of ceil(70 / 32) = 3 batches


def test_a_deadline_stops_the_device_with_the_steps_that_fit() -> None:
    paced, inner, clock = _paced()
    result = paced.train(np.zeros(2, np.float32), TrainPlan(local_steps=10, deadline=101.6))
    assert inner.plans[-1].local_steps == 3  # 3 x 0.5 s fit in 1.6 s
    assert (result.steps_completed, result.steps_planned) == (3, 10)  # partial work, said so
    assert clock.now() == pytest.approx(101.5)
    np.testing.assert_array_equal(result.params, [3.0, 3.0])


def test_a_device_that_cannot_finish_a_step_reports_no_work_at_its_deadline() -> None:
    paced, inner, clock = _paced()
    params = np.ones(2, np.float32)
    result = paced.train(params, TrainPlan(local_steps=10, deadline=100.2))
    assert not inner.plans
    assert (result.steps_completed, result.steps_planned) == (0, 10)
    assert clock.now() == pytest.approx(100.2)
    np.testing.assert_array_equal(result.params, params)
    assert result.params is not params


def test_an_evaluation_takes_a_step_per_batch() -> None:
    paced, _, clock = _paced()
    assert paced.evaluate(np.zeros(2, np.float32)) == {"accuracy": 0.5}
    assert clock.now() == pytest.approx(101.5)  # ceil(70 / 32) = 3 batches of 0.5 s


def test_a_step_must_take_some_time() -> None:
    for step_s in (0.0, -1.0, float("nan")):
        with pytest.raises(ConfigError, match="more than 0"):
            PacedTrainer(_Instant(), step_s, batch_size=32)


def test_a_trainer_that_stops_early_takes_the_time_of_the_steps_it_did() -> None:
    """A ``[partial_work]`` straggler inside the pace does half its task: the device spends
    the time of those steps, not of the whole task."""

    class Half(_Instant):
        def train(self, params: np.ndarray, plan: TrainPlan) -> TrainResult:
            full = super().train(params, plan)
            return TrainResult(full.params, EXAMPLES, full.steps_completed // 2,
                               full.steps_planned)

    clock = ManualClock(start=0.0)
    result = PacedTrainer(Half(), 0.5, batch_size=32, clock=clock).train(
        np.zeros(2, np.float32), TrainPlan(local_steps=8))
    assert (result.steps_completed, result.steps_planned) == (4, 8)
    assert clock.now() == pytest.approx(2.0)
    assert result.metrics["train_seconds"] == pytest.approx(2.0)
