"""Experiment settings that cannot take effect in their mode or combination are refused when the
config is read, naming the key, instead of being recorded as applied and never read."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest

from fedlink.errors import ConfigError
from fedlink.experiment.config import ExperimentConfig
from fedlink.experiment.virtual import VirtualSection

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

VIRTUAL: dict[str, Any] = {"run": {"mode": "virtual"}}
POPULATION: dict[str, Any] = {"run": {"mode": "virtual"}, "virtual": {"population": 40}}


def _with(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra``'s tables merged in (one level of sub-tables deep)."""
    table = copy.deepcopy(base)
    for section, values in extra.items():
        merged = table.setdefault(section, {})
        for key, value in values.items():
            if isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key] = {**merged[key], **value}
            else:
                merged[key] = value
    return table


def _refused(table: dict[str, Any], key: str) -> str:
    with pytest.raises(ConfigError) as refused:
        ExperimentConfig.from_dict(table)
    message = str(refused.value)
    assert key in message, message
    return message


# -- [virtual] population > 0: synthetic clients train a numpy softmax regression -------------

@pytest.mark.parametrize(("extra", "key"), [
    ({"client": {"trainer": "dp_sgd"}}, "client.trainer"),
    ({"client": {"optimizer": "adam"}}, "client.optimizer"),
    ({"client": {"optimizer_options": {"momentum": 0.9}}}, "client.optimizer_options"),
    ({"client": {"loss": "mse"}}, "client.loss"),
    ({"client": {"keep_local": ["bias"]}}, "client.keep_local"),
    ({"client": {"device": "auto"}}, "client.device"),
    ({"coordinator": {"training": {"trainer_options": {"prox_mu": 5.0}}}},
     "coordinator.training.trainer_options"),
    ({"model": {"name": "logreg"}}, "model.name"),
    ({"model": {"options": {"hidden": [8]}}}, "model.options"),
    ({"model": {"init": "model.npy"}}, "model.init"),
    ({"data": {"clients": 4}}, "data.clients"),
    ({"run": {"evaluate_train": True}}, "run.evaluate_train"),
    ({"coordinator": {"evaluation": {"fraction": 1.0, "holdout": 0.5}}},
     "coordinator.evaluation.holdout"),
    ({"coordinator": {"evaluator": "fedlink.experiment.setup:Experiment"}},
     "coordinator.evaluator"),
])
def test_a_synthetic_population_refuses_the_training_setup_it_never_reads(
        extra: dict[str, Any], key: str) -> None:
    message = _refused(_with(POPULATION, extra), key)
    assert "population > 0" in message and "population = 0" in message  # why, and the way out


def test_a_synthetic_population_keeps_what_it_reads() -> None:
    config = ExperimentConfig.from_dict(_with(POPULATION, {
        "virtual": {"features": 8, "classes": 3},
        "client": {"compression": "topk", "compression_options": {"density": 0.5}},
        "coordinator": {"training": {"local_steps": 3, "batch_size": 8, "learning_rate": 0.1},
                        "evaluation": {"fraction": 0.5}},
        "network": {"preset": "3g"}}))
    assert (config.virtual.features, config.virtual.classes) == (8, 3)
    assert config.coordinator.training.learning_rate == 0.1


def test_keep_local_is_refused_with_a_synthetic_population_too() -> None:
    _refused(_with(POPULATION, {"client": {"keep_local": ["batchnorm"]}}), "client.keep_local")
    _refused(_with(VIRTUAL, {"client": {"keep_local": ["batchnorm"]}}), "[client] keep_local")


def test_user_level_dp_samples_from_the_synthetic_population() -> None:
    config = ExperimentConfig.from_dict(_with(POPULATION, {
        "client": {"privacy": "dp_fedavg"},
        "coordinator": {"flush": {"goal": 4},
                        "hooks": [{"name": "dp_fedavg", "noise_multiplier": 1.0}]}}))
    [hook] = [h for h in config.coordinator.hooks if h["name"] == "dp_fedavg"]
    assert (hook["population"], hook["cohort"]) == (40, 4)  # not [data] clients' 10


# -- [run] mode = "virtual": no server, sockets or client sessions ----------------------------

@pytest.mark.parametrize(("extra", "key"), [
    ({"coordinator": {"tls": {"cert_file": "c.pem", "key_file": "k.pem"}}}, "coordinator.tls"),
    ({"coordinator": {"auth": {"secret_env": "FEDLINK_SECRET"}}}, "coordinator.auth"),
    ({"coordinator": {"join_token": "s3cret"}}, "coordinator.join_token"),
    ({"coordinator": {"state_dir": "state"}}, "coordinator.state_dir"),
    ({"coordinator": {"drain_s": 1.0}}, "coordinator.drain_s"),
    ({"coordinator": {"metrics": {"enabled": True}}}, "coordinator.metrics"),
    ({"coordinator": {"netcheck": {"enabled": True}}}, "coordinator.netcheck"),
    ({"coordinator": {"limits": {"max_update_bytes": 100}}},
     "coordinator.limits.max_update_bytes"),
    ({"coordinator": {"limits": {"max_clients": 1}}}, "coordinator.limits.max_clients"),
    ({"coordinator": {"limits": {"requests_per_s": 0.001}}},
     "coordinator.limits.requests_per_s"),
    ({"run": {"train_workers": 4}}, "run.train_workers"),
    ({"client": {"retry": {"max_attempts": 1}}}, "client.retry"),
    ({"client": {"liveness": {"keepalive_time_s": 0.5}}}, "client.liveness"),
    ({"client": {"compression": "topk", "density_bounds": [0.001, 0.1],
                 "density_safety": 0.9}}, "client.density_safety"),
])
def test_virtual_mode_refuses_what_it_does_not_model(extra: dict[str, Any], key: str) -> None:
    message = _refused(_with(VIRTUAL, extra), key)
    assert "mode = 'virtual' does not model" in message and "mode = 'grpc'" in message
    grpc = _with(extra, {"run": {"mode": "grpc"}})
    if "tls" not in extra.get("coordinator", {}):  # gRPC simulate refuses TLS when it runs
        ExperimentConfig.from_dict(grpc)  # the same setting is read there


def test_virtual_mode_keeps_density_bounds_which_clamp_the_codecs_density() -> None:
    """With no goodput measured the bounds still clamp the codec's density (topk at 0.01
    with bounds [0.05, 0.1] encodes at 0.05), so virtual mode takes them."""
    config = ExperimentConfig.from_dict(_with(VIRTUAL, {"client": {
        "compression": "topk", "compression_options": {"density": 0.01},
        "density_bounds": [0.05, 0.1]}}))
    pipeline = config.client.pipeline()
    assert pipeline.density is not None
    assert pipeline.density.choose(pipeline.codec, 1000, None, None).density == 0.05


def test_virtual_mode_keeps_the_limits_its_loop_reads() -> None:
    limits = {"inline_bytes": 1024, "chunk_bytes": 4096, "max_examples_per_update": 50,
              "delta_history": 2, "retry_after_s": 2.0, "heartbeat_interval_s": 2.0,
              "long_poll_s": 1.0, "max_task_s": 600.0, "task_quiet_multiple": 2.0}
    config = ExperimentConfig.from_dict(_with(VIRTUAL, {"coordinator": {"limits": limits}}))
    assert config.coordinator.limits.inline_limit == 1024
    assert config.coordinator.limits.liveness_timeout == 3 * 2.0 + 1.0  # derived from them
    alone = ExperimentConfig.from_dict(_with(VIRTUAL, {"coordinator": {"limits": {
        "liveness_timeout_s": 30.0}}}))
    assert alone.coordinator.limits.liveness_timeout == 30.0


def test_virtual_mode_refuses_what_derives_a_liveness_timeout_set_outright() -> None:
    """With no long polls, ``long_poll_s`` only derives the liveness timeout."""
    limits = {"long_poll_s": 1.0, "liveness_timeout_s": 30.0}
    message = _refused(_with(VIRTUAL, {"coordinator": {"limits": limits}}),
                       "coordinator.limits.long_poll_s")
    assert "liveness_timeout_s = 30 sets itself" in message
    ExperimentConfig.from_dict(_with({"coordinator": {"limits": limits}},
                                     {"run": {"mode": "grpc"}}))  # a real coordinator reads it
    # a timeout shorter than the default interval needs a shorter interval, which it bounds
    short = {"heartbeat_interval_s": 1.0, "liveness_timeout_s": 3.0}
    config = ExperimentConfig.from_dict(_with(VIRTUAL, {"coordinator": {"limits": short}}))
    assert config.coordinator.limits.liveness_timeout == 3.0


# -- [run] mode = "grpc": [virtual], [ray] and [run] backend are never read -------------------

@pytest.mark.parametrize(("extra", "key"), [
    ({"virtual": {"population": 1000}}, "virtual.population"),
    ({"virtual": {"deterministic": True}}, "virtual.deterministic"),
    ({"virtual": {"workers": 2}}, "virtual.workers"),
    ({"ray": {"address": "10.0.0.1:6379"}}, "ray.address"),
    ({"run": {"backend": "ray"}}, "run.backend"),
])
def test_a_grpc_run_refuses_the_virtual_mode_settings(extra: dict[str, Any], key: str) -> None:
    message = _refused(extra, key)
    assert "mode = 'virtual'" in message
    ray = _with(VIRTUAL, {"run": {"backend": "ray"}, "virtual": {"workers": 1}})
    ExperimentConfig.from_dict(_with(ray, extra))  # read in a virtual run that trains on Ray


# -- [virtual] knobs whose switch is off -------------------------------------------------------

@pytest.mark.parametrize(("virtual", "key"), [
    ({"online_fraction": 0.01}, "virtual.online_fraction"),
    ({"period_s": 60.0}, "virtual.period_s"),
    ({"trace_file": "avail.csv"}, "virtual.trace_file"),
    ({"availability": "trace", "trace_file": "avail.csv", "online_fraction": 0.5},
     "virtual.online_fraction"),
    ({"availability": "diurnal", "trace_file": "avail.csv"}, "virtual.trace_file"),
    ({"features": 2}, "virtual.features"),
    ({"classes": 2}, "virtual.classes"),
])
def test_a_virtual_knob_whose_switch_is_off_is_refused(virtual: dict[str, Any],
                                                       key: str) -> None:
    _refused(_with(VIRTUAL, {"virtual": virtual}), key)


def test_virtual_knobs_with_their_switch_on_load() -> None:
    VirtualSection(availability="diurnal", online_fraction=0.1, period_s=3600.0)
    VirtualSection(availability="trace", trace_file="avail.csv", period_s=3600.0)
    VirtualSection(population=10, features=4, classes=2)


@pytest.mark.parametrize(("extra", "key"), [
    ({"run": {"backend": "ray"}}, "run.backend"),
    ({"run": {"backend": "mypackage.backends:mine"}}, "run.backend"),
    ({"ray": {"address": "10.9.9.9:6379"}}, "ray.address"),
    ({"run": {"backend": "ray"}, "ray": {"address": "10.9.9.9:6379"}}, "run.backend"),
    ({"virtual": {"workers": 1}, "ray": {"address": "10.9.9.9:6379"}}, "ray.address"),
    ({"virtual": {"workers": 1}, "run": {"backend": "inline"},
      "ray": {"address": "10.9.9.9:6379"}}, "ray.address"),
])
def test_a_backend_or_ray_address_that_never_trains_is_refused(extra: dict[str, Any],
                                                               key: str) -> None:
    _refused(_with(VIRTUAL, extra), key)


def test_a_backend_with_workers_loads() -> None:
    config = ExperimentConfig.from_dict(_with(VIRTUAL, {
        "run": {"backend": "ray"}, "virtual": {"workers": 2},
        "ray": {"address": "10.9.9.9:6379"}}))
    assert config.ray.address == "10.9.9.9:6379"
    ExperimentConfig.from_dict(_with(VIRTUAL, {"run": {"backend": "inline"}}))  # what 0 means


# -- combinations within a mode -----------------------------------------------------------------

@pytest.mark.parametrize("mode", ["grpc", "virtual"])
def test_evaluate_train_is_refused_with_an_evaluator_of_your_own(mode: str) -> None:
    message = _refused({"run": {"mode": mode, "evaluate_train": True},
                        "coordinator": {"evaluator": "mypackage.scores:evaluate"}},
                       "run.evaluate_train")
    assert "[coordinator] evaluator" in message


def test_evaluate_train_is_refused_beside_an_evaluate_plug() -> None:
    """A plug never reaches the config: the experiment refuses it when it builds the
    evaluator, before the run starts."""
    from fedlink.experiment.setup import Experiment, Plugs

    config = ExperimentConfig.from_dict({"run": {"evaluate_train": True}})
    experiment = Experiment.build(config, Plugs(evaluate=lambda model, test: {}))
    with pytest.raises(ConfigError, match=r"^run\.evaluate_train: .*evaluate plug"):
        experiment.evaluator()


@pytest.mark.parametrize(("client", "key"), [
    ({"optimizer_options": {"momentum": 0.9}}, "client.optimizer_options"),
    ({"optimizer": "adam"}, "client.optimizer"),
    ({"loss": "mse"}, "client.loss"),
    ({"keep_local": ["bias"]}, "client.keep_local"),
])
def test_dp_sgd_refuses_the_torch_trainers_settings(client: dict[str, Any], key: str) -> None:
    message = _refused({"client": {"trainer": "dp_sgd", **client}}, key)
    assert "dp_sgd" in message and "trainer = 'torch'" in message


def test_the_dp_sgd_builder_refuses_a_plugged_loss() -> None:
    """A loss passed to the run as an object never reaches the config's check."""
    from types import SimpleNamespace

    from fedlink.experiment.trainers import dp_sgd_trainer

    config = SimpleNamespace(client=SimpleNamespace())
    with pytest.raises(ConfigError, match="trains with cross_entropy: the loss passed"):
        dp_sgd_trainer(config, lambda out, y: out.sum())  # type: ignore[arg-type]


def test_density_safety_is_refused_without_density_bounds() -> None:
    message = _refused({"client": {"compression": "topk", "density_safety": 0.9}},
                       "client.density_safety")
    assert "density_bounds" in message
    config = ExperimentConfig.from_dict({"client": {
        "compression": "topk", "density_bounds": [0.01, 0.1], "density_safety": 0.9}})
    assert config.client.density_safety == 0.9


@pytest.mark.parametrize("safety", [-3.0, 0.0, 7.0])
def test_density_safety_is_range_checked(safety: float) -> None:
    _refused({"client": {"compression": "topk", "density_bounds": [0.01, 0.1],
                         "density_safety": safety}}, "client.density_safety")


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.toml")), ids=lambda p: p.name)
def test_every_example_still_loads(path: Path) -> None:
    ExperimentConfig.from_toml(path)


def test_virtual_mode_refuses_a_device_pace_and_names_its_own() -> None:
    """``[run] device_step_s`` paces gRPC mode's clients; virtual mode's steps take
    ``[virtual] step_cost_s``, so the key would be recorded and never read there."""
    message = _refused(_with(VIRTUAL, {"run": {"device_step_s": 0.05}}), "run.device_step_s")
    assert "[virtual] step_cost_s" in message
    ExperimentConfig.from_dict({"run": {"device_step_s": 0.05}})  # read in gRPC mode
    for bad in (-0.1, math.inf, math.nan):
        _refused({"run": {"device_step_s": bad}}, "run.device_step_s")


def test_paced_devices_need_a_training_thread_each() -> None:
    """A paced client waits out its device time on its training thread: a pool of fewer
    threads than clients would queue devices that are only waiting."""
    paced = {"run": {"device_step_s": 0.05, "train_workers": 3}, "data": {"clients": 4}}
    assert "raise it to 4" in _refused(paced, "run.train_workers")
    ExperimentConfig.from_dict(_with(paced, {"run": {"train_workers": 4}}))
    ExperimentConfig.from_dict(_with(paced, {"run": {"train_workers": 0}}))
    ExperimentConfig.from_dict(_with(paced, {"run": {"device_step_s": 0.0}}))
