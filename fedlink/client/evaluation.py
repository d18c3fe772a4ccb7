"""Federated evaluation on the client: an evaluation task scores the global model on the local
data and reports it, with no update (torch-free; the trainer does the scoring).

The coordinator sends evaluation tasks (``TaskKind.EVALUATE``; who and when:
``fedlink.coordinator.evaluations``) only to a client that advertised the ``evaluate``
capability at ``Join``, and a session advertises it only when its trainer can evaluate: it has
an ``evaluate(params) -> {metric: value}`` method (``Evaluates``; the ``Trainer`` protocol
itself is unchanged, so a trainer without the method is still a trainer, one that never
evaluates). ``TorchTrainer.evaluate`` reports ``loss``, ``accuracy`` (classification) and
``examples``, the number of examples scored, which weights the scores in the run's federated
curve (``fedlink.metrics.federated``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Protocol, cast, runtime_checkable

import numpy as np

from fedlink.client.base import Trainer, TrainerWrapper, TrainPlan, TrainResult
from fedlink.errors import ConfigError
from fedlink.messages import EVALUATE_CAPABILITY, EvaluationReport, Task

EXAMPLES_KEY = "examples"
"""The score that says how many examples the others were measured on (the report's weight)."""


@runtime_checkable
class Evaluates(Protocol):
    """A trainer that can also score a model on its local data."""

    def evaluate(self, params: np.ndarray) -> Mapping[str, float]:
        """Scores of the model ``params`` (not modified) on the local data, e.g. ``loss``,
        ``accuracy``, and ``examples`` (how many were scored; default: all of them)."""
        ...


def evaluator_of(trainer: Trainer) -> Evaluates | None:
    """``trainer`` when it has an ``evaluate`` method (``Evaluates``), else ``None``.

    Read with ``getattr``: a wrapping trainer (``wrapped_evaluate``) answers ``evaluate`` with
    ``AttributeError`` when what it wraps cannot evaluate.
    """
    return cast(Evaluates, trainer) if callable(getattr(trainer, "evaluate", None)) else None


def wrapped_evaluate(inner: Trainer) -> Callable[[np.ndarray], Mapping[str, float]]:
    """For the ``evaluate`` property of a trainer that wraps ``inner``: ``inner``'s
    ``evaluate``, or ``AttributeError`` when it has none, so that the wrapper evaluates (and
    its session advertises the capability) exactly when what it wraps can."""
    evaluator = evaluator_of(inner)
    if evaluator is None:
        raise AttributeError(f"{type(inner).__name__} has no evaluate method")
    return evaluator.evaluate


def capabilities(trainer: Trainer) -> tuple[str, ...]:
    """What a session with ``trainer`` advertises at ``Join``."""
    return (EVALUATE_CAPABILITY,) if evaluator_of(trainer) is not None else ()


def evaluation_report(client_id: str, task: Task, trainer: Trainer,
                      scores: Mapping[str, float]) -> EvaluationReport:
    """The report of ``task`` from the trainer's ``scores`` (``ConfigError`` when a score is
    not a finite number: the coordinator would refuse it)."""
    values = {str(key): float(value) for key, value in scores.items()}
    bad = sorted(key for key, value in values.items() if not math.isfinite(value))
    if bad:
        raise ConfigError(f"the trainer's evaluate returned non-finite scores {bad}")
    examples = int(values.pop(EXAMPLES_KEY, trainer.num_examples()))
    return EvaluationReport(client_id=client_id, task_id=task.task_id,
                            model_version=task.model_version, num_examples=examples,
                            metrics=values)


def decline(client_id: str, task: Task) -> EvaluationReport:
    """The report that declines ``task`` (protocol 1.2): the client cannot score the model
    (no local example, or a score that is not a finite number), and says so, so that the
    coordinator closes the task instead of handing it back until it expires."""
    return EvaluationReport(client_id=client_id, task_id=task.task_id,
                            model_version=task.model_version, num_examples=0, metrics={})


def report_or_decline(client_id: str, task: Task, trainer: Trainer,
                      scores: Mapping[str, float]) -> tuple[EvaluationReport, str]:
    """The report of ``task`` from the trainer's ``scores``, or its ``decline`` with why
    (``""`` for a report): what a real client sends and the virtual clock simulates."""
    try:
        report = evaluation_report(client_id, task, trainer, scores)
    except ConfigError as err:
        return decline(client_id, task), str(err)
    if report.num_examples < 1:
        return decline(client_id, task), "no local examples to score it on"
    return report, ""


class HeldOutEvaluation(TrainerWrapper):
    """A client that trains on part of its data and scores evaluation tasks on the rest
    (``[coordinator.evaluation] holdout``), so its federated accuracy is not measured on
    the examples it trained on.

    ``trainer`` trains (and holds the client's state: ``keep_local`` tensors are put into a
    model before it is scored, through its ``personalize`` when it has one); ``held_out`` is
    the same kind of trainer over the held-out examples, used only to ``evaluate``.
    """

    def __init__(self, trainer: Trainer, held_out: Trainer) -> None:
        self.trainer = trainer
        self._held_out = wrapped_evaluate(held_out)

    def train(self, params: np.ndarray, plan: TrainPlan) -> TrainResult:
        """Train on the training part."""
        return self.trainer.train(params, plan)

    def evaluate(self, params: np.ndarray) -> Mapping[str, float]:
        """Score ``params`` (with this client's kept tensors) on the held-out examples."""
        personalize = getattr(self.trainer, "personalize", None)
        return self._held_out(personalize(params) if callable(personalize) else params)

