"""Coordinator settings that no code reads in a combination are refused when the config is
read, naming the key and the way out, never recorded as applied (each case was accepted and
left the model unchanged before)."""

from __future__ import annotations

from typing import Any

import pytest

from fedlink.coordinator import CoordinatorConfig
from fedlink.errors import ConfigError
from fedlink.experiment.partial_work import PartialWorkSection
from fedlink.sim import ExperimentConfig

DP = {"name": "dp_fedavg", "clip_norm": 1.0, "noise_multiplier": 0.5, "sample_rate": 0.1}


def refused(table: dict[str, Any], key: str) -> str:
    """The message ``CoordinatorConfig.from_dict(table)`` is refused with; it names ``key``."""
    with pytest.raises(ConfigError) as err:
        CoordinatorConfig.from_dict(table)
    message = str(err.value)
    assert message.startswith(f"{key}:"), message
    return message


@pytest.mark.parametrize(("option", "value"), [
    ("clip_learning_rate", 50.0), ("clipped_count_stddev", 1000.0)])
def test_adaptive_clipping_options_with_a_fixed_clip_norm_are_refused(option: str,
                                                                      value: float) -> None:
    message = refused({"hooks": [{**DP, option: value}]}, f"coordinator.hooks[0]: {option}")
    assert "target_quantile" in message
    adaptive = {**DP, "target_quantile": 0.5, "clipped_count_stddev": 10.0}
    CoordinatorConfig.from_dict({"hooks": [{**adaptive, option: value}]})  # adaptive reads it
    CoordinatorConfig.from_dict({"hooks": [{**DP, "clip_learning_rate": 0.2,
                                            "clipped_count_stddev": 0.0}]})  # the defaults


@pytest.mark.parametrize("key", ["warmup", "window"])
@pytest.mark.parametrize("bound", [{"norm_bound": 0.5}, {"norm_bound_adaptive": False}])
def test_the_adaptive_bounds_window_without_the_adaptive_bound_is_refused(
        key: str, bound: dict[str, Any]) -> None:
    """Refused exactly where ``norm_bound_multiple`` is: a fixed bound, or none."""
    robust = {"warmup": 3} if key == "warmup" else {"window": 16}
    message = refused({**bound, "robust": robust}, f"coordinator.robust.{key}")
    assert "norm_bound_adaptive = true and norm_bound = 0" in message
    with pytest.raises(ConfigError, match=r"^coordinator\.norm_bound_multiple:"):
        CoordinatorConfig.from_dict({**bound, "norm_bound_multiple": 3.0})
    CoordinatorConfig.from_dict({"robust": robust})  # the adaptive bound reads it


@pytest.mark.parametrize("key", ["norm_bound_multiple", "warmup", "window"])
def test_the_adaptive_bounds_settings_under_a_plain_mean_hook_are_refused(key: str) -> None:
    """DP-FedAvg needs the plain mean: the guard then leaves the adaptive bound out, so its
    multiple and its window change nothing (with the guard off, the streaming bound keeps
    its multiple)."""
    table: dict[str, Any] = ({"norm_bound_multiple": 3.0} if key == "norm_bound_multiple"
                             else {"robust": {key: 3 if key == "warmup" else 16}})
    where = key if key == "norm_bound_multiple" else f"robust.{key}"
    message = refused({**table, "hooks": [DP]}, f"coordinator.{where}")
    assert "no flush hook that needs the plain mean" in message
    if key == "norm_bound_multiple":
        CoordinatorConfig.from_dict({**table, "hooks": [DP], "robust": {"enabled": False}})


@pytest.mark.parametrize(("table", "way_out"), [
    ({"robust": {"drop_opposed": False}}, "drop_opposed = true"),
    ({"hooks": [DP]}, "coordinator.hooks"),  # DP-FedAvg keeps every update: drop is off
])
def test_drop_min_updates_without_drop_is_refused(table: dict[str, Any], way_out: str) -> None:
    robust = {**table.get("robust", {}), "drop_min_updates": 9}
    message = refused({**table, "robust": robust}, "coordinator.robust.drop_min_updates")
    assert way_out in message
    CoordinatorConfig.from_dict(table)
    CoordinatorConfig.from_dict({"robust": {"drop_min_updates": 9}})


@pytest.mark.parametrize("weight", [
    {"staleness_weight": "polynomial", "staleness_weight_options": {"a": 3.0}},
    {"staleness_weight": "hinge", "staleness_weight_options": {"a": 50.0, "b": 0}}])
def test_a_staleness_weight_without_stale_updates_is_refused(weight: dict[str, Any]) -> None:
    message = refused(weight, "coordinator.staleness_weight")
    assert "max_staleness >= 1" in message
    refused({**weight, "flush": {"preset": "sync"}}, "coordinator.staleness_weight")
    for preset in ("elastic", "async"):  # their max_staleness is above 0
        CoordinatorConfig.from_dict({**weight, "flush": {"preset": preset}})
    CoordinatorConfig.from_dict({**weight, "flush": {"max_staleness": 1}})


def test_evaluation_every_without_evaluation_is_refused() -> None:
    message = refused({"evaluation": {"every": 7}}, "coordinator.evaluation.every")
    assert "fraction > 0" in message
    CoordinatorConfig.from_dict({"evaluation": {"every": 7, "fraction": 0.5}})


def test_a_partial_work_seed_without_partial_work_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^partial_work\.seed: .*set fraction > 0"):
        ExperimentConfig.from_dict({"partial_work": {"seed": 99}})
    with pytest.raises(ConfigError, match=r"^partial_work\.seed:"):
        PartialWorkSection(seed=99)
    assert PartialWorkSection(fraction=0.5, seed=99).seed == 99


def test_local_epochs_beside_local_steps_is_refused() -> None:
    message = refused({"training": {"local_steps": 3, "local_epochs": 50}},
                      "coordinator.training.local_epochs")
    assert "local_steps = 0" in message
    CoordinatorConfig.from_dict({"training": {"local_steps": 3}})
    CoordinatorConfig.from_dict({"training": {"local_epochs": 50}})
