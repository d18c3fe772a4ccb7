"""One ``Registry`` for every name a config accepts: decorator or call, taken names refused,
import strings everywhere; datasets, partitioners and trainers register the same way."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fedlink.client import Trainer, TrainPlan, TrainResult
from fedlink.data import CentralData, Dataset, load_federated, register_dataset
from fedlink.data.base import register_partitioner
from fedlink.errors import ConfigError
from fedlink.experiment.trainers import TRAINERS
from fedlink.registry import Registry
from fedlink.sim import ExperimentConfig


def test_register_works_as_decorator_and_as_call() -> None:
    things: Registry[int] = Registry("thing")

    @things.register("one")
    def one() -> int:
        return 1

    assert one() == 1  # the decorated function is handed back unchanged
    assert things.register("two", lambda: 2)() == 2
    assert things.create("one") + things.create("two") == 3
    assert things.names() == ("one", "two")
    assert "one" in things and things.registered("two") and not things.registered("x:y")


def test_a_taken_name_is_refused_unless_replaced() -> None:
    things: Registry[int] = Registry("thing")
    things.register("n", lambda: 1)
    with pytest.raises(ConfigError, match="thing 'n' is already registered"):
        things.register("n", lambda: 2)
    things.register("n", lambda: 3, replace=True)
    assert things.create("n") == 3


def test_bad_names_and_items_are_refused() -> None:
    things: Registry[int] = Registry("thing")
    with pytest.raises(ConfigError, match="non-empty string"):
        things.register("")(lambda: 1)
    with pytest.raises(ConfigError, match="without ':'"):
        things.register("pkg:attr", lambda: 1)
    with pytest.raises(ConfigError, match="not callable"):
        things.register("five", 5)  # type: ignore[call-overload]
    with pytest.raises(ConfigError, match="unknown thing 'nope'; known: "):
        things.get("nope")


def _tiny(num_clients: int, rng: np.random.Generator, *, size: int = 12) -> CentralData:
    x = rng.random((size, 2)).astype(np.float32)
    data = Dataset(x, np.arange(size) % 2, num_classes=2, num_features=2, name="tiny")
    return CentralData(train=data, test=data)


def test_register_dataset_is_a_decorator() -> None:
    decorated = register_dataset("test-registry-tiny", replace=True)(_tiny)
    assert decorated is _tiny

    @register_partitioner("test-registry-halves", replace=True)
    def halves(labels: np.ndarray, num_clients: int,
               rng: np.random.Generator) -> list[np.ndarray]:
        return list(np.array_split(np.arange(len(labels)), num_clients))

    fed = load_federated("test-registry-tiny", 2, 0, partition="test-registry-halves", size=8)
    assert fed.client_sizes() == (4, 4)
    # a decorated dataset is checked at parse time like a built-in: its options are known
    ExperimentConfig.from_dict({"data": {"dataset": "test-registry-tiny",
                                         "partition": "test-registry-halves",
                                         "options": {"size": 8}}})
    with pytest.raises(ConfigError, match=r"^data\.options\.size: expected an integer"):
        ExperimentConfig.from_dict({"data": {"dataset": "test-registry-tiny",
                                             "options": {"size": "8"}}})


def test_a_dataset_builder_can_be_named_by_import_string() -> None:
    fed = load_federated("tests.unit.test_registry:_tiny", 3, 0, size=9)
    assert fed.num_clients == 3


class _Constant(Trainer):
    """Returns its parameters unchanged (a trainer registered by name in a test)."""

    def num_examples(self) -> int:
        return 1

    def train(self, params: np.ndarray, plan: TrainPlan) -> TrainResult:
        return TrainResult(params=params.copy(), num_examples=1, steps_completed=0,
                           steps_planned=plan.local_steps)


def test_trainers_are_registrable_by_name() -> None:
    seen: list[Any] = []

    @TRAINERS.register("test-registry-constant", replace=True)
    def constant(config: ExperimentConfig, loss: Any) -> Any:
        seen.append(loss)
        return lambda model, data, *, seed: _Constant()

    assert {"torch", "dp_sgd"} <= set(TRAINERS.names())
    config = ExperimentConfig.from_dict({"client": {"trainer": "test-registry-constant"}})
    factory = TRAINERS.get(config.client.trainer)(config, config.client.loss)
    assert isinstance(factory(None, None, seed=0), _Constant)
    assert seen == ["cross_entropy"]
    with pytest.raises(ConfigError, match=r"client\.trainer: must be one of .*dp_sgd.*torch"):
        ExperimentConfig.from_dict({"client": {"trainer": "tensorflow"}})
