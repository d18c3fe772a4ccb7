"""Honest records: what ``summary.json`` says is what ran, in both modes (issue 24).

A setting that cannot apply in the combination chosen is refused before the run, naming the
keys; the data's name is the loader's; a central evaluator that raises is recorded; a virtual
run's summary means by each key what a real-gRPC run's does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from fedlink.client.base import TrainResult
from fedlink.client.torch_trainer import TorchTrainer
from fedlink.data import FederatedData, load_federated
from fedlink.data.torch_data import TorchFederatedData
from fedlink.errors import ConfigError
from fedlink.experiment.setup import Experiment, Plugs
from fedlink.metrics.events import read_events
from fedlink.metrics.formatting import key_figures
from fedlink.sim import ExperimentConfig
from fedlink.sim.runner import run_simulation


def tiny(mode: str = "virtual", **extra: dict[str, Any]) -> ExperimentConfig:
    """Four digits clients, two rounds of a goal of four."""
    table: dict[str, Any] = {
        "run": {"name": "honest", "seed": 3, "mode": mode},
        "data": {"dataset": "digits", "clients": 4},
        "coordinator": {"rounds": 2, "flush": {"goal": 4, "min_updates": 4}},
    }
    for section, values in extra.items():
        table[section] = {**table.get(section, {}), **values}
    return ExperimentConfig.from_dict(table)


def own_split(*, num_clients: int, seed: int) -> FederatedData:
    """A loader that splits its data itself (IID)."""
    return load_federated("digits", num_clients, seed, "iid")


def torch_split(*, num_clients: int, seed: int) -> TorchFederatedData:
    """A loader returning torch datasets, already split."""
    data = load_federated("digits", num_clients, seed, "iid")

    def ds(d: Any) -> TensorDataset:
        return TensorDataset(torch.as_tensor(np.array(d.x)), torch.as_tensor(np.array(d.y)))

    return TorchFederatedData([ds(c) for c in data.clients], ds(data.test), num_classes=10)


@pytest.mark.parametrize("loader", [own_split, torch_split])
def test_partition_with_a_loader_that_splits_is_refused_naming_both_keys(loader: Any) -> None:
    config = tiny(data={"partition": "dirichlet", "options": {"alpha": 0.3}})
    with pytest.raises(ConfigError) as caught:
        Experiment.build(config, Plugs(data=loader))
    message = str(caught.value)
    assert "[data] partition" in message and "[data] options.alpha" in message
    assert "plugged data" in message and loader.__qualname__ in message


def test_dataset_and_loader_together_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"\[data\] dataset and \[data\] loader"):
        ExperimentConfig.from_dict({"data": {"dataset": "digits", "loader": "m.n:f"}})


def test_the_summary_records_the_loaders_name_as_the_dataset(tmp_path: Path) -> None:
    result = run_simulation(tiny(), tmp_path, progress=False, data=own_split)
    recorded = result.summary["config"]["data"]
    assert recorded["dataset"] == f"{__name__}:own_split"
    assert recorded["partition"] is None
    assert ExperimentConfig.from_dict({"data": {"loader": "m.n:f"}}).to_dict()[
        "data"]["dataset"] == "m.n:f"


def plain_factory(model: Any, data: Any, *, seed: int) -> TorchTrainer:
    """A trainer factory that takes none of the [client] training settings."""
    return TorchTrainer(model, data, seed=seed)


received: dict[str, Any] = {}


def settings_factory(model: Any, data: Any, *, seed: int, loss: Any = "cross_entropy",
                     keep_local: tuple[str, ...] = ()) -> TorchTrainer:
    """A trainer factory that takes ``loss`` and ``keep_local``."""
    received.update(loss=loss, keep_local=keep_local)
    return TorchTrainer(model, data, seed=seed, loss=loss, keep_local=keep_local)


def test_settings_a_trainer_factory_cannot_take_are_refused_naming_the_keys() -> None:
    config = tiny("grpc", client={"loss": "nll", "optimizer": "adam", "keep_local": ["0.*"]})
    with pytest.raises(ConfigError) as caught:
        Experiment.build(config, Plugs(trainer=plain_factory))
    message = str(caught.value)
    for key in ("[client] loss", "[client] optimizer", "[client] keep_local",
                "[client] trainer", "plain_factory"):
        assert key in message
    with pytest.raises(ConfigError, match=r"\[client\] optimizer"):
        Experiment.build(config, Plugs(trainer=settings_factory))


def test_settings_a_trainer_factory_takes_are_given_to_it() -> None:
    config = tiny("grpc", client={"loss": "mse", "keep_local": ["0.*"]})
    experiment = Experiment.build(config, Plugs(trainer=settings_factory))
    experiment.trainer(0)
    assert received == {"loss": "mse", "keep_local": ("0.*",)}


def broken_evaluator(model: Any, test: Any) -> dict[str, float]:
    raise RuntimeError("shape mismatch in my metric")


def test_an_evaluator_that_raises_on_the_initial_model_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\[coordinator\] evaluator.*shape mismatch"):
        run_simulation(tiny(), tmp_path, progress=False, evaluate=broken_evaluator)


class FailsLater:
    """Scores the first model, raises on every later one."""

    calls = 0

    def __call__(self, model: Any, test: Any) -> dict[str, float]:
        FailsLater.calls += 1
        if FailsLater.calls > 1:
            raise ValueError("metric went wrong")
        return {"accuracy": 0.5}


@pytest.mark.parametrize("mode", ["virtual", "grpc"])
def test_an_evaluator_that_raises_later_is_in_the_summary_and_table(
        tmp_path: Path, mode: str) -> None:
    FailsLater.calls = 0
    result = run_simulation(tiny(mode), tmp_path, progress=False, evaluate=FailsLater())
    summary = result.summary
    assert summary["final_accuracy"] is None
    assert summary["evaluation_errors"] == 2
    assert "ValueError: metric went wrong" in summary["evaluation_error"]
    assert any("evaluation FAILED" in label for label, _ in key_figures(summary))
    assert "metric went wrong" in result.report.read_text()
    assert "central evaluation raised in 2 of 2 flushes" in summary["warning"]
    assert "target accuracy could not end the run" in summary["warning"]


class OutOfTime:
    """A client trainer that always runs out of time before its first step."""

    def __init__(self, data: Any) -> None:
        self.examples = len(data)

    def num_examples(self) -> int:
        return self.examples

    def train(self, params: np.ndarray, plan: Any) -> TrainResult:
        return TrainResult(params + 1.0, self.examples, 0, 5)


def out_of_time(model: Any, data: Any, *, seed: int, **settings: Any) -> OutOfTime:
    return OutOfTime(data)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["virtual", "grpc"])
def test_a_run_in_which_every_update_is_refused_ends_and_says_so(
        tmp_path: Path, mode: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Each client's update carries no work: its task closes and answers for its place, so
    each round ends empty; "completed 2 rounds" alone would read like a run that learned."""
    result = run_simulation(tiny(mode), tmp_path, progress=False, trainer=out_of_time)
    summary = result.summary
    assert summary["finish_reason"] == "completed 2 rounds"
    assert summary["updates_accepted"] == 0 and summary["updates_refused"] == 8
    assert summary["empty_flushes"] == summary["rounds"] == 2
    warning = summary["warning"]
    assert warning.startswith("no flush aggregated an update, so the final model is the "
                              "initial one") and "8 no_work" in warning
    assert "no flush aggregated an update" in capsys.readouterr().err
    initial = Experiment.build(tiny(mode)).initial_vector()
    np.testing.assert_array_equal(np.load(result.run_dir / "model.npy"), initial)


def test_virtual_and_real_summaries_have_the_same_keys_meaning_the_same(
        tmp_path: Path) -> None:
    real = run_simulation(tiny("grpc"), tmp_path / "real", progress=False).summary
    virtual = run_simulation(tiny("virtual"), tmp_path / "virtual", progress=False).summary
    shared = {"clients", "bytes_up", "bytes_down", "wall_seconds", "rounds", "updates_accepted",
              "tasks_issued", "final_accuracy", "simulation_seconds", "config", "warning"}
    assert shared <= set(real) and shared <= set(virtual)
    for summary in (real, virtual):
        assert summary["clients"] == 4
        assert summary["rounds"] == 2 and summary["updates_accepted"] == 8
        assert summary["bytes_down"] > 0  # one model download per task
        # wall_seconds is process wall time, within the whole simulation's
        assert 0 < summary["wall_seconds"] <= summary["simulation_seconds"]
    # the same downloads: in both modes a client that holds the last version fetches the
    # coordinator's delta from it instead of the whole model
    for key in ("bytes_down", "bytes_down_delta", "delta_bytes_saved"):
        assert real[key] == pytest.approx(virtual[key], rel=0.05), key
    assert virtual["delta_bytes_saved"] > 0
    assert real["bytes_up"] == virtual["bytes_up"]
    # virtual model time has its own key, not wall_seconds
    assert "model_seconds" in virtual and virtual["wall_seconds"] != virtual["model_seconds"]
    assert np.isfinite(virtual["model_seconds"])


def test_a_virtual_cohort_completed_by_refusals_flushes_then_not_at_the_next_poll(
        tmp_path: Path) -> None:
    """As a server's timekeeper wakes when the flush is due, not a poll interval later."""
    config = tiny("virtual", virtual={"poll_s": 5.0})
    result = run_simulation(config, tmp_path, progress=False, trainer=out_of_time)
    events = read_events(result.run_dir / "events.jsonl")
    flushes = [e for e in events if e["kind"] == "flush"]
    assert len(flushes) == 2
    for flush in flushes:
        last = max(e["elapsed"] for e in events if e["kind"] == "update_refused"
                   and e["elapsed"] <= flush["elapsed"])
        assert flush["elapsed"] == last


@pytest.mark.parametrize("mode", ["virtual", "grpc"])
@pytest.mark.parametrize("flush,problem", [
    ({"goal": 6, "min_updates": 6, "deadline_s": 0}, "min_updates = 6"),
    ({"goal": 6, "deadline_s": 0}, "goal = 6 and no deadline"),
])
def test_a_flush_rule_the_fleet_can_never_meet_is_refused_before_it_waits_for_ever(
        tmp_path: Path, mode: str, flush: dict[str, Any], problem: str) -> None:
    config = tiny(mode, coordinator={"flush": flush})
    with pytest.raises(ConfigError, match=rf"^coordinator\.flush: {problem},? but the run has "
                                          r"4 clients.*raise \[data\] clients$"):
        run_simulation(config, tmp_path, progress=False)
    assert not (tmp_path / "honest" / "events.jsonl").exists()


@pytest.mark.parametrize("mode", ["virtual", "grpc"])
def test_a_run_whose_every_model_step_was_refused_says_so(tmp_path: Path, mode: str) -> None:
    """A server learning rate 10^5 times too large: each step explodes and is refused, so the
    run ends "completed" with every update accepted and its initial model."""
    config = tiny(mode, coordinator={"server_optimizer_options": {"lr": 1e5}})
    summary = run_simulation(config, tmp_path, progress=False).summary
    assert summary["updates_accepted"] == 8 and summary["empty_flushes"] == 0
    assert summary["flushes_refused"] == summary["rounds"] == 2
    assert summary["warning"].startswith(
        "every flush's model step was refused, so the final model is the initial one")
    assert "server_optimizer_options" in summary["warning"]


def loss_only(model: Any, test: Any) -> dict[str, float]:
    return {"loss": 1.0}


@pytest.mark.parametrize("mode", ["virtual", "grpc"])
def test_a_target_accuracy_no_evaluation_could_reach_is_refused(tmp_path: Path,
                                                                 mode: str) -> None:
    """An evaluator that scores no accuracy: the target would never end the run."""
    config = tiny(mode, run={"target_accuracy": 0.5})
    with pytest.raises(ConfigError, match=r"^\[run\] target_accuracy: the run's evaluator "
                                          r"\(\[coordinator\] evaluator\) returns no 'accuracy' "
                                          r"\(it returned \['loss'\]\)"):
        run_simulation(config, tmp_path, progress=False, evaluate=loss_only)
    plain = run_simulation(tiny(mode), tmp_path, progress=False, evaluate=loss_only).summary
    assert plain["final_loss"] == 1.0  # without a target such an evaluator is fine


SECURE = {"norm_bound": 0.0, "norm_bound_adaptive": False, "robust": {"enabled": False},
          "secure": {"enabled": True, "phase_s": 2.0},
          "flush": {"goal": 4, "min_updates": 2, "deadline_s": 60.0}}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["virtual", "grpc"])
def test_secure_sums_of_updates_that_did_no_work_are_warned_of(tmp_path: Path,
                                                                mode: str) -> None:
    """A secure sum cannot leave one update out without losing its group's survivors' work,
    so an update with no step in it is summed like the others: the record says so."""
    summary = run_simulation(tiny(mode, coordinator=SECURE), tmp_path, progress=False,
                             trainer=out_of_time).summary
    assert summary["updates_accepted"] == 8
    assert summary["secure_updates_without_work"] == 8
    assert summary["warning"].startswith("8 of 8 updates in secure sums completed no local "
                                         "step")


class ScoresNaN(OutOfTime):
    """Trains (a step of +0.01) and scores every model NaN: a client reports no such score."""

    def train(self, params: np.ndarray, plan: Any) -> TrainResult:
        return TrainResult(params + 0.01, self.examples, 5, 5)

    def evaluate(self, params: np.ndarray) -> dict[str, float]:
        return {"accuracy": float("nan"), "loss": 1.0}


def scores_nan(model: Any, data: Any, *, seed: int, **settings: Any) -> ScoresNaN:
    return ScoresNaN(data)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["virtual", "grpc"])
def test_evaluation_tasks_no_client_can_score_are_declined_and_warned_of(tmp_path: Path,
                                                                         mode: str) -> None:
    """Each client declines its task (it would not send a NaN): over gRPC the task was
    handed back at every check-in until it expired, the run's end waiting on it."""
    config = tiny(mode, coordinator={"evaluation": {"fraction": 0.5}})
    summary = run_simulation(config, tmp_path, progress=False, trainer=scores_nan).summary
    issued = summary["evaluations_issued"]
    assert issued > 0 and summary["evaluations_reported"] == 0
    assert summary["evaluations_declined"] == issued
    assert "federated_evaluation" not in summary
    assert summary["warning"].startswith(
        f"federated evaluation issued {issued} tasks and no client reported a score "
        f"({issued} declined")
