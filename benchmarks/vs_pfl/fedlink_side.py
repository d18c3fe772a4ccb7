"""fedlink's side of ``vs_pfl_ratio``: the ``task`` on the virtual-clock loop, clean links.

The same engine, flush rule, pipeline and event log as ``[run] mode = "virtual"``
(``VirtualLoop``), on a population of ``task`` users made lazily (``DigitsUsers``: a user's
examples and trainer exist only while it is selected), trained in the loop's process by
fedlink's ``TorchTrainer``, synchronous FedAvg (goal = cohort), the central test accuracy
after every round.

Like for like, the flush is plain weighted FedAvg, as pfl's: fedlink's flush guard (on by
default, ``[coordinator.robust]``: it buffers a flush's updates and computes order-free robust
statistics over them) and its streaming adaptive norm bound (``norm_bound_adaptive``: each
update clipped to twice the recent median norm, which pfl does not do) are off unless
``guarded=True``, which measures fedlink's default.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from vs_pfl import task


class DigitsUsers:
    """``size`` users of ``task``: no link model (clean links), speed 1, lazily made data.

    Trainers share one torch module (training is sequential in the loop's process and each
    task loads the global vector into it first), as pfl keeps one model per worker; each is
    derived from the first (``WorkingModelTrainers``), as a virtual run of the built-in
    trainer does.
    """

    def __init__(self, size: int, train: Any, module: Any) -> None:
        from fedlink.client.torch_trainer import TorchTrainer, WorkingModelTrainers

        self._size = size
        self._train = train
        self._trainers = WorkingModelTrainers(TorchTrainer, module)
        self._last: tuple[int, np.ndarray] = (-1, np.zeros(0, np.int64))

    def _rows(self, index: int) -> np.ndarray:
        """User ``index``'s examples (the loop asks their count, then for the trainer: the
        last user's are kept, as pfl makes each user's data once)."""
        if self._last[0] != index:
            self._last = (index, task.user_indices(index, len(self._train)))
        return self._last[1]

    @property
    def size(self) -> int:
        """The population."""
        return self._size

    def profile(self, index: int) -> None:
        """Clean links: no link model."""
        return None

    def speed(self, index: int) -> float:
        """Every device alike."""
        return 1.0

    def num_examples(self, index: int) -> int:
        """User ``index``'s example count."""
        return len(self._rows(index))

    def trainer(self, index: int) -> Any:
        """A ``TorchTrainer`` over user ``index``'s examples, made now."""
        return self._trainers(self._trainers.model, self._train.subset(self._rows(index)),
                              seed=index)


def run_fedlink(users: int, cohort: int, rounds: int, train: Any, test: Any,
                workdir: Path, guarded: bool = False) -> dict[str, float]:
    """One run; ``wall_s`` from building the model to the end of the loop (as pfl's)."""
    import torch

    from fedlink.client.pipeline import UpdatePipeline
    from fedlink.clock import ManualClock
    from fedlink.coordinator.config import CoordinatorConfig
    from fedlink.metrics import EventLog
    from fedlink.models import build_model
    from fedlink.models.evaluate import Evaluator
    from fedlink.params import to_vector
    from fedlink.sim.virtual.loop import LoopOptions, VirtualLoop

    torch.set_num_threads(1)
    started = time.perf_counter()
    config = CoordinatorConfig.from_dict({
        "rounds": rounds, "flush": {"goal": cohort, "deadline_s": 0},
        "robust": {"enabled": guarded}, "norm_bound_adaptive": guarded,
        "training": {"local_epochs": 1, "batch_size": task.BATCH_SIZE,
                     "learning_rate": task.LEARNING_RATE}})
    module = build_model("mlp", num_features=task.FEATURES, num_classes=task.CLASSES,
                         seed=task.SEED, hidden=list(task.HIDDEN))
    evaluate = Evaluator(module, test)
    clock = ManualClock()
    with EventLog(workdir / "vs-pfl-events.jsonl", clock=clock.now) as events:
        loop = VirtualLoop(config, to_vector(module), DigitsUsers(users, train, module),
                           UpdatePipeline, events, clock, LoopOptions(seed=task.SEED),
                           evaluate=evaluate)
        totals = loop.run()
    wall = time.perf_counter() - started
    return {"wall_s": wall, "loop_wall_s": totals.wall_s,
            "accuracy": float(evaluate(np.asarray(loop.engine.model))["accuracy"]),
            "tasks": float(totals.tasks)}
