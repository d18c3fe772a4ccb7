"""Partial work: simulated stragglers (``[partial_work]``) and ``drop_partial``."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import FakeClock

from fedlink.client import TrainPlan, TrainResult
from fedlink.coordinator import CoordinatorConfig, FlushRule, RoundEngine
from fedlink.coordinator.engine import ReceivedUpdate
from fedlink.errors import ConfigError, UpdateRefused
from fedlink.experiment.partial_work import PartialWorkSection, PartialWorkTrainer
from fedlink.messages import Task, Wait
from fedlink.metrics import EventLog
from fedlink.refusals import RefusalCode
from fedlink.sim import ExperimentConfig

DIM = 3
X0 = np.zeros(DIM, np.float32)


class CountingTrainer:
    """Reports ``steps_per_epoch x epochs`` (or ``local_steps``) steps, all completed."""

    def __init__(self, steps_per_epoch: int = 4) -> None:
        self.steps_per_epoch = steps_per_epoch
        self.plans: list[TrainPlan] = []

    def num_examples(self) -> int:
        return 40

    def train(self, params: np.ndarray, plan: TrainPlan) -> TrainResult:
        self.plans.append(plan)
        steps = plan.local_steps if plan.uses_steps else plan.local_epochs * self.steps_per_epoch
        return TrainResult(params + 1, 40, steps, steps)


def test_stragglers_do_a_uniform_part_of_the_epochs_and_report_the_full_plan() -> None:
    inner = CountingTrainer()
    trainer = PartialWorkSection(fraction=0.9).trainer(inner, index=3, run_seed=0)
    assert isinstance(trainer, PartialWorkTrainer)
    plan = TrainPlan(local_epochs=20, batch_size=10)
    results = [trainer.train(X0, plan) for _ in range(2000)]
    assert all(r.steps_planned == 80 for r in results)
    done = np.array([r.steps_completed for r in results])
    partial = done < 80
    assert 0.9 * 19 / 20 - 0.03 < partial.mean() < 0.9 * 19 / 20 + 0.03
    assert set(done[partial] // 4) == set(range(1, 20))  # 1..19 epochs (20 is the full task)
    assert trainer.partial_tasks == partial.sum() and trainer.tasks == 2000


def test_step_plans_straggle_in_steps_and_draws_are_seeded_per_client() -> None:
    def draws(index: int, seed: int = 0) -> list[int]:
        trainer = PartialWorkSection(fraction=0.5).trainer(CountingTrainer(), index, seed)
        return [trainer.train(X0, TrainPlan(local_steps=7)).steps_completed for _ in range(50)]

    assert draws(1) == draws(1)
    assert draws(1) != draws(2) and draws(1) != draws(1, seed=1)
    assert set(draws(1)) <= set(range(1, 8)) and min(draws(1)) < 7


def test_partial_work_config_section() -> None:
    config = ExperimentConfig.from_dict({"partial_work": {"fraction": 0.9}})
    assert config.partial_work == PartialWorkSection(fraction=0.9)
    assert not ExperimentConfig().partial_work.enabled
    trainer = CountingTrainer()
    assert PartialWorkSection().trainer(trainer, 0, 0) is trainer
    with pytest.raises(ConfigError, match=r"partial_work\.fraction"):
        ExperimentConfig.from_dict({"partial_work": {"fraction": 1.5}})
    with pytest.raises(ConfigError, match="unknown keys"):
        ExperimentConfig.from_dict({"partial_work": {"share": 0.5}})


def make_engine(clock: FakeClock, **flush: object) -> RoundEngine:
    config = CoordinatorConfig(rounds=5, drop_partial=True,
                               flush=FlushRule(**flush))  # type: ignore[arg-type]
    return RoundEngine(config, X0.copy(), EventLog(None), clock=clock)


def submit(engine: RoundEngine, client: str, task: Task, delta: float, done: int,
           planned: int = 10) -> None:
    engine.submit(ReceivedUpdate(client, task.task_id, task.model_version,
                                 np.full(DIM, delta, np.float32), 10, done, planned, 4 * DIM))


def test_drop_partial_refuses_partial_updates_which_still_answer_for_their_place(
        fake_clock: FakeClock) -> None:
    engine = make_engine(fake_clock, goal=3, min_updates=3, deadline_s=None)
    tasks = {c: engine.issue(c) for c in ("a", "b", "c")}
    assert all(isinstance(t, Task) for t in tasks.values())
    assert isinstance(engine.issue("d"), Wait)  # cohort full
    with pytest.raises(UpdateRefused, match="drop_partial") as refused:
        submit(engine, "a", tasks["a"], 5.0, done=4)  # type: ignore[arg-type]
    assert refused.value.reason is RefusalCode.PARTIAL_DROPPED
    assert isinstance(engine.issue("d"), Wait)  # the dropped update keeps its place
    assert isinstance(engine.issue("a"), Wait)  # and is not asked again this version
    submit(engine, "b", tasks["b"], 1.0, done=10)  # type: ignore[arg-type]
    assert engine.version == 0
    submit(engine, "c", tasks["c"], 3.0, done=10)  # type: ignore[arg-type]
    assert engine.version == 1  # goal counted the dropped update; the mean ignores it
    # of 1.0 and 3.0, the flush guard clips 3.0 to 2 x the lower-median norm: the mean of 1
    # and 2 (with the dropped 5.0 in it, the guard's trimmed mean of 1, 3, 5 would be 3)
    np.testing.assert_allclose(engine.model, np.full(DIM, 1.5))


def test_a_cohort_dropped_whole_flushes_at_poll_leaving_the_model(fake_clock: FakeClock) -> None:
    engine = make_engine(fake_clock, goal=2, min_updates=2, deadline_s=None)
    tasks = [engine.issue(c) for c in ("a", "b")]
    for client, task in zip(("a", "b"), tasks, strict=True):
        with pytest.raises(UpdateRefused):
            submit(engine, client, task, 1.0, done=3)  # type: ignore[arg-type]
    assert engine.version == 0
    outcome = engine.poll()
    assert outcome is not None and outcome.num_updates == 0 and engine.version == 1
    np.testing.assert_array_equal(engine.model, X0)
    assert isinstance(engine.issue("a"), Task)  # a new cohort is asked


def test_evaluator_scores_training_data_when_asked() -> None:
    from fedlink.experiment.setup import Experiment, pooled_train

    config = ExperimentConfig.from_dict({"run": {"evaluate_train": True},
                                         "data": {"dataset": "digits", "clients": 3},
                                         "model": {"name": "logreg"}})
    experiment = Experiment.build(config)
    scores = experiment.evaluator()(experiment.initial_vector())
    assert set(scores) == {"accuracy", "loss", "train_accuracy", "train_loss"}
    assert len(pooled_train(experiment.data)) == sum(experiment.data.client_sizes())
    plain = ExperimentConfig.from_dict({"data": {"dataset": "digits", "clients": 3},
                                        "model": {"name": "logreg"}})
    assert set(Experiment.build(plain).evaluator()(experiment.initial_vector())) == {
        "accuracy", "loss"}


@pytest.mark.parametrize("training", [{"local_epochs": 1}, {"local_steps": 1}])
def test_partial_work_on_a_task_of_one_step_is_refused(training: dict[str, int]) -> None:
    """``w`` is drawn in ``1..E``: with ``E = 1`` no task is ever done in part."""
    table = {"partial_work": {"fraction": 0.5}, "coordinator": {"training": training}}
    with pytest.raises(ConfigError, match=r"^partial_work\.fraction: a task of one step"):
        ExperimentConfig.from_dict(table)
    ExperimentConfig.from_dict({**table, "coordinator": {"training": {
        key: 2 for key in training}}})
