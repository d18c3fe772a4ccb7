"""The engine treats model state by kind: optimizers, robust rules and hooks see weights only."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import FakeClock

from fedlink.aggregate import SERVER_OPTIMIZERS, FlushHook, FlushInfo, ServerOptimizer
from fedlink.coordinator import CoordinatorConfig, FlushRule, RoundEngine
from fedlink.coordinator.engine import ReceivedUpdate
from fedlink.metrics import EventLog
from fedlink.params import BUFFER, COUNTER, TRAINABLE, ParamSpec

# 3 weights, a running variance of 2 and a counter: the layout of a tiny BatchNorm model
SPEC = ParamSpec(names=("w", "running_var", "num_batches_tracked"),
                 shapes=((3,), (2,), ()), dtypes=("float32", "float32", "int64"),
                 kinds=(TRAINABLE, BUFFER, COUNTER))
INITIAL = np.array([0.0, 0.0, 0.0, 1.0, 1.0, 0.0], dtype=np.float32)


def engine_for(clock: FakeClock, spec: ParamSpec | None, **coordinator: Any) -> RoundEngine:
    config = CoordinatorConfig(rounds=10, flush=FlushRule(goal=2, min_updates=2),
                               **coordinator)
    return RoundEngine(config, INITIAL, EventLog(None), clock=clock, spec=spec)


def one_round(engine: RoundEngine, deltas: list[np.ndarray]) -> np.ndarray:
    tasks = [engine.issue(f"c{i}") for i in range(len(deltas))]
    for i, (task, delta) in enumerate(zip(tasks, deltas, strict=True)):
        engine.submit(ReceivedUpdate(f"c{i}", task.task_id, task.model_version,  # type: ignore[union-attr]
                                     np.asarray(delta, dtype=np.float32), 10, 1, 1, 24))
    return engine.model.copy()


# Each client's variance shrank (0.3 and 0.5 of the start) and counted 5 batches.
DELTAS = [np.array([0.1, -0.2, 0.3, -0.7, -0.7, 5.0], np.float32),
          np.array([0.3, -0.2, 0.1, -0.5, -0.5, 5.0], np.float32)]


@pytest.mark.parametrize("optimizer", ["fedyogi", "fedadam", "fedadagrad", "fedavgm"])
def test_adaptive_optimizers_average_buffers_and_step_weights(fake_clock: FakeClock,
                                                              optimizer: str) -> None:
    model = one_round(engine_for(fake_clock, SPEC, server_optimizer=optimizer), DELTAS)
    # the buffers are the clients' mean: variance 0.4, 5 batches, not an optimizer's step
    np.testing.assert_allclose(model[3:], [0.4, 0.4, 5.0], rtol=1e-6)
    # the weights are the optimizer's own step, as without buffers
    alone = SERVER_OPTIMIZERS.create(optimizer).step(
        np.zeros(3, np.float32), np.mean([d[:3] for d in DELTAS], axis=0).astype(np.float32))
    np.testing.assert_allclose(model[:3], alone, rtol=1e-6)


def test_without_a_spec_every_element_is_stepped(fake_clock: FakeClock) -> None:
    model = one_round(engine_for(fake_clock, None, server_optimizer="fedyogi"), DELTAS)
    assert abs(model[3] - 0.4) > 0.1  # yogi steps the variance instead of averaging it


class Recording(ServerOptimizer):
    """A user's optimizer: plain averaging that remembers the spec it was given."""

    def step(self, model: np.ndarray, mean_delta: np.ndarray) -> np.ndarray:
        assert self.spec is not None
        trainable = self.spec.mask(TRAINABLE)
        out = model + mean_delta
        out[trainable] += 1.0  # a bias it adds to weights only, so a buffer would show it
        return out

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def test_a_users_optimizer_receives_the_spec(fake_clock: FakeClock) -> None:
    SERVER_OPTIMIZERS.register("test_recording", replace=True)(Recording)
    model = one_round(engine_for(fake_clock, SPEC, server_optimizer="test_recording"), DELTAS)
    np.testing.assert_allclose(model[:3], [1.2, 0.8, 1.2], rtol=1e-6)
    np.testing.assert_allclose(model[3:], [0.4, 0.4, 5.0], rtol=1e-6)


def test_norm_bound_and_robust_rules_see_weights_only(fake_clock: FakeClock) -> None:
    # a counter's delta of 5 would dominate a norm bound of 1 over the whole vector
    model = one_round(engine_for(fake_clock, SPEC, norm_bound=1.0, aggregator="median"),
                      DELTAS)
    np.testing.assert_allclose(model[:3], [0.2, -0.2, 0.2], rtol=1e-6)
    np.testing.assert_allclose(model[3:], [0.4, 0.4, 5.0], rtol=1e-6)


class AddOne(FlushHook):
    """A central hook that shifts what it is given (noise, in a real one)."""

    def on_flush(self, mean_delta: np.ndarray, flush: FlushInfo) -> np.ndarray:
        return mean_delta + 1.0


def test_flush_hooks_act_on_weights_only(fake_clock: FakeClock) -> None:
    engine = engine_for(fake_clock, SPEC)
    engine._hooks = [AddOne()]
    model = one_round(engine, DELTAS)
    np.testing.assert_allclose(model[:3], [1.2, 0.8, 1.2], rtol=1e-6)
    np.testing.assert_allclose(model[3:], [0.4, 0.4, 5.0], rtol=1e-6)


def test_a_spec_of_another_size_is_refused(fake_clock: FakeClock) -> None:
    with pytest.raises(ValueError, match="spec describes 6 elements, the model has 5"):
        RoundEngine(CoordinatorConfig(), INITIAL[:5], EventLog(None), clock=fake_clock,
                    spec=SPEC)
