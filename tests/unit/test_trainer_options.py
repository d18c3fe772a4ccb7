"""``[coordinator.training] trainer_options`` the run's trainer would not read are refused:
a misspelt ``prox_mu`` or DP-SGD's options under the plain trainer would otherwise train as if
they were unset, and the run would record them as applied."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fedlink.errors import ConfigError
from fedlink.experiment.trainers import TRAINERS, options_read, reads_options
from fedlink.sim import ExperimentConfig

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DP = {"dp_noise_multiplier": 1.0, "dp_max_grad_norm": 1.0, "dp_delta": 1e-5}


def _table(trainer: str, options: dict[str, Any]) -> dict[str, Any]:
    return {"client": {"trainer": trainer},
            "coordinator": {"training": {"trainer_options": options}}}


def test_dp_sgd_options_under_the_plain_trainer_are_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"trainer_options: \[client\] trainer = 'torch' does "
                                          r"not read dp_delta, dp_max_grad_norm, "
                                          r"dp_noise_multiplier.*it reads: prox_mu"):
        ExperimentConfig.from_dict(_table("torch", DP))


def test_a_misspelt_prox_mu_is_refused_and_the_right_one_is_kept() -> None:
    with pytest.raises(ConfigError, match="does not read prox_m,"):
        ExperimentConfig.from_dict(_table("torch", {"prox_m": 0.1}))
    config = ExperimentConfig.from_dict(_table("torch", {"prox_mu": 0.1}))
    assert config.coordinator.training.trainer_options == {"prox_mu": "0.1"}


@pytest.mark.parametrize(("options", "unread"), [
    ({**DP, "prox_mu": 0.1}, "prox_mu"),
    ({**DP, "dp_max_grad_nrom": 0.5}, "dp_max_grad_nrom"),
])
def test_the_dp_sgd_trainer_refuses_options_it_does_not_read(options: dict[str, Any],
                                                              unread: str) -> None:
    with pytest.raises(ConfigError, match=f"'dp_sgd' does not read {unread},"):
        ExperimentConfig.from_dict(_table("dp_sgd", options))


def test_the_examples_that_set_trainer_options_still_load() -> None:
    for name in ("digits_dp_sgd.toml", "synthetic_fedprox.toml"):
        config = ExperimentConfig.from_toml(EXAMPLES / name)
        read = options_read(config.client.trainer)
        assert read is not None and set(config.coordinator.training.trainer_options) <= read


def test_a_trainer_that_does_not_say_what_it_reads_is_not_checked() -> None:
    TRAINERS.register("test-options-silent", lambda config, loss: None, replace=True)
    config = ExperimentConfig.from_dict(_table("test-options-silent", {"anything": 1}))
    assert config.coordinator.training.trainer_options == {"anything": "1"}
    # an import string names a factory this check does not import
    config = ExperimentConfig.from_dict(_table("custom_algorithm:trainer", {"feddyn_alpha": 1}))
    assert options_read(config.client.trainer) is None


def test_a_registered_trainer_declares_its_options_with_reads_options() -> None:
    @TRAINERS.register("test-options-scaffold", replace=True)
    @reads_options("scaffold_lr")
    def scaffold(config: Any, loss: Any) -> None:
        return None

    assert options_read("test-options-scaffold") == {"scaffold_lr"}
    ExperimentConfig.from_dict(_table("test-options-scaffold", {"scaffold_lr": 0.1}))
    with pytest.raises(ConfigError, match="does not read prox_mu"):
        ExperimentConfig.from_dict(_table("test-options-scaffold", {"prox_mu": 0.1}))

