"""``[coordinator.training] trainer_options`` the simulated clients' trainer would not read are
refused: a misspelt ``prox_mu`` or DP-SGD's options under the plain trainer would otherwise
train as if they were unset, and the run would record them as applied. A plugged trainer and a
served coordinator's clients (which bring their own trainers) are not checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fedlink.errors import ConfigError
from fedlink.experiment.config import refuse_unread_trainer_options
from fedlink.experiment.trainers import TRAINERS, options_read, reads_options
from fedlink.sim import ExperimentConfig

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DP = {"dp_noise_multiplier": 1.0, "dp_max_grad_norm": 1.0, "dp_delta": 1e-5}


def _table(trainer: str, options: dict[str, Any]) -> dict[str, Any]:
    return {"client": {"trainer": trainer},
            "coordinator": {"training": {"trainer_options": options}}}


def _checked(table: dict[str, Any]) -> ExperimentConfig:
    """``table``'s config, checked as a simulation of it checks it."""
    config = ExperimentConfig.from_dict(table)
    refuse_unread_trainer_options(config)
    return config


def test_dp_sgd_options_under_the_plain_trainer_are_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"trainer_options: \[client\] trainer = 'torch' does "
                                          r"not read dp_delta, dp_max_grad_norm, "
                                          r"dp_noise_multiplier.*it reads: prox_mu"):
        _checked(_table("torch", DP))


def test_a_misspelt_prox_mu_is_refused_and_the_right_one_is_kept() -> None:
    with pytest.raises(ConfigError, match="does not read prox_m,"):
        _checked(_table("torch", {"prox_m": 0.1}))
    config = _checked(_table("torch", {"prox_mu": 0.1}))
    assert config.coordinator.training.trainer_options == {"prox_mu": "0.1"}


@pytest.mark.parametrize(("options", "unread"), [
    ({**DP, "prox_mu": 0.1}, "prox_mu"),
    ({**DP, "dp_max_grad_nrom": 0.5}, "dp_max_grad_nrom"),
])
def test_the_dp_sgd_trainer_refuses_options_it_does_not_read(options: dict[str, Any],
                                                              unread: str) -> None:
    with pytest.raises(ConfigError, match=f"'dp_sgd' does not read {unread},"):
        _checked(_table("dp_sgd", options))


def test_the_examples_that_set_trainer_options_still_load() -> None:
    for name in ("digits_dp_sgd.toml", "synthetic_fedprox.toml"):
        config = ExperimentConfig.from_toml(EXAMPLES / name)
        read = options_read(config.client.trainer)
        assert read is not None and set(config.coordinator.training.trainer_options) <= read


def test_a_trainer_that_does_not_say_what_it_reads_is_not_checked() -> None:
    TRAINERS.register("test-options-silent", lambda config, loss: None, replace=True)
    config = _checked(_table("test-options-silent", {"anything": 1}))
    assert config.coordinator.training.trainer_options == {"anything": "1"}
    # an import string names a factory this check does not import
    config = _checked(_table("custom_algorithm:trainer", {"feddyn_alpha": 1}))
    assert options_read(config.client.trainer) is None


def test_a_registered_trainer_declares_its_options_with_reads_options() -> None:
    @TRAINERS.register("test-options-scaffold", replace=True)
    @reads_options("scaffold_lr")
    def scaffold(config: Any, loss: Any) -> None:
        return None

    assert options_read("test-options-scaffold") == {"scaffold_lr"}
    _checked(_table("test-options-scaffold", {"scaffold_lr": 0.1}))
    with pytest.raises(ConfigError, match="does not read prox_mu"):
        _checked(_table("test-options-scaffold", {"prox_mu": 0.1}))



def test_a_simulation_refuses_them_unless_its_trainer_is_plugged(tmp_path: Path) -> None:
    """The check runs where the clients' trainer is known: a simulation of the configured
    trainer. A plugged trainer (here FedDyn's, which reads its own option) is not checked,
    nor is the config alone: a served coordinator's clients bring their own trainers."""
    from fedlink.experiment.setup import Experiment, Plugs
    from fedlink.sim import run_simulation

    table = {**_table("torch", {"feddyn_alpha": 0.01}), "data": {"clients": 2}}
    config = ExperimentConfig.from_dict(table)  # accepted: fedlink serve reads it so
    with pytest.raises(ConfigError, match="does not read feddyn_alpha"):
        run_simulation(config, tmp_path, progress=False)
    assert not (tmp_path / config.run.name).exists()  # refused before the run folder
    plugged = Experiment.build(config, Plugs(trainer=lambda model, data, *, seed: None))
    plugged.check_simulated_trainer_options()
