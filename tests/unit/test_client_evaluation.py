"""The client's side of evaluation tasks (``fedlink.client.evaluation``): who advertises the
capability, what a report carries, and declining a task the trainer cannot do."""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest
from conftest import TowardTrainer

from fedlink.client import ClientSession
from fedlink.client.evaluation import (
    HeldOutEvaluation,
    capabilities,
    evaluation_report,
    evaluator_of,
)
from fedlink.errors import ConfigError
from fedlink.messages import EVALUATE_CAPABILITY, RunConfig, Task, TaskKind, TensorHeader

TASK = Task("e3-v4", 4, 0, 0, 10.0, TensorHeader("fp32", (2,), "float32", 8, "sha256:0"),
            kind=TaskKind.EVALUATE)


class Scoring(TowardTrainer):
    """Can evaluate."""

    def __init__(self, scores: dict[str, float]) -> None:
        super().__init__(np.zeros(2, np.float32), examples=12)
        self.scores = scores

    def evaluate(self, params: np.ndarray) -> dict[str, float]:
        """The scores it was given."""
        return self.scores


def test_only_a_trainer_with_evaluate_advertises_the_capability() -> None:
    plain = TowardTrainer(np.zeros(2, np.float32))
    assert capabilities(plain) == () and evaluator_of(plain) is None
    scoring = Scoring({})
    assert capabilities(scoring) == (EVALUATE_CAPABILITY,) and evaluator_of(scoring) is scoring


def test_a_report_carries_the_examples_scored_apart_from_the_scores() -> None:
    report = evaluation_report("c1", TASK, Scoring({}), {"loss": 0.5, "accuracy": 0.8,
                                                        "examples": 7.0})
    assert (report.task_id, report.model_version, report.num_examples) == ("e3-v4", 4, 7)
    assert report.metrics == {"loss": 0.5, "accuracy": 0.8}
    default = evaluation_report("c1", TASK, Scoring({}), {"loss": 0.5})
    assert default.num_examples == 12  # all the local examples
    with pytest.raises(ConfigError, match="non-finite"):
        evaluation_report("c1", TASK, Scoring({}), {"loss": float("inf")})


def test_a_trainer_without_evaluate_declines_with_a_log_line(
        caplog: pytest.LogCaptureFixture) -> None:
    waited: list[float] = []

    async def sleep(seconds: float) -> None:
        waited.append(seconds)

    session = ClientSession("127.0.0.1:1", TowardTrainer(np.zeros(2, np.float32)),
                            sleep=sleep)
    session.config = RunConfig("run", 2, heartbeat_interval_s=3.0)
    with caplog.at_level(logging.WARNING, logger="fedlink.client.session"):
        asyncio.run(session._answer(TASK))
    assert "declining evaluation task e3-v4: the trainer has no evaluate method" in caplog.text
    assert waited == [3.0] and session.stats.evaluations == 0


def test_wrapping_trainers_evaluate_exactly_when_what_they_wrap_does() -> None:
    from fedlink.client.lazy import LazyTrainer
    from fedlink.clock import ManualClock
    from fedlink.experiment.partial_work import PartialWorkTrainer
    from fedlink.sim.stragglers import PacedTrainer, SlowedTrainer

    plain = TowardTrainer(np.zeros(2, np.float32))
    scoring = Scoring({"loss": 1.5})
    for wrap in (lambda t: SlowedTrainer(t, 2.0, ManualClock()),
                 lambda t: PacedTrainer(t, 0.05, 32, ManualClock()),
                 lambda t: PartialWorkTrainer(t, 0.5, np.random.default_rng(0))):
        assert capabilities(wrap(plain)) == ()
        wrapped = evaluator_of(wrap(scoring))
        assert wrapped is not None and wrapped.evaluate(np.zeros(2, np.float32)) == {"loss": 1.5}
    built: list[int] = []

    def build() -> Scoring:
        built.append(1)
        return scoring

    assert capabilities(LazyTrainer(build)) == ()  # it cannot know without loading the data
    lazy = LazyTrainer(build, evaluates=True)
    assert capabilities(lazy) == (EVALUATE_CAPABILITY,) and built == []  # data not loaded
    assert evaluator_of(lazy).evaluate(np.zeros(2, np.float32)) == {"loss": 1.5}  # type: ignore[union-attr]
    assert built == [1]


def test_wrapping_trainers_answer_for_the_model_spec_of_what_they_wrap() -> None:
    """A session binds its pipeline to its trainer's ``spec`` (privacy and compression treat
    buffers and counters apart from weights): every wrapper a simulation or a held-out split
    puts around a trainer must pass the spec on, or a straggler's lossy codec would quantize
    a BatchNorm's running variance like a weight."""
    from fedlink.clock import ManualClock
    from fedlink.experiment.partial_work import PartialWorkTrainer
    from fedlink.params import BUFFER, TRAINABLE, ParamSpec
    from fedlink.sim.stragglers import PacedTrainer, SlowedTrainer

    class WithSpec(TowardTrainer):
        spec = ParamSpec(("w", "running_var"), ((2,), (1,)), ("float32", "float32"),
                         (TRAINABLE, BUFFER))

    inner = WithSpec(np.zeros(3, np.float32))
    wraps = (lambda t: SlowedTrainer(t, 2.0, ManualClock()),
             lambda t: PacedTrainer(t, 0.05, 32, ManualClock()),
             lambda t: PartialWorkTrainer(t, 0.5, np.random.default_rng(0)),
             lambda t: HeldOutEvaluation(t, Scoring({"loss": 1.0})))
    for wrap in wraps:
        assert wrap(inner).spec is WithSpec.spec
        assert wrap(wrap(inner)).spec is WithSpec.spec  # a straggler with partial work
        assert wrap(TowardTrainer(np.zeros(3, np.float32))).spec is None
