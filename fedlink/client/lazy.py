"""``LazyTrainer``: a trainer built the first time it is needed, so a client's data is loaded
when that client trains, not when the run starts (torch-free)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from fedlink.client.base import Trainer, TrainPlan, TrainResult
from fedlink.client.evaluation import wrapped_evaluate
from fedlink.errors import ConfigError
from fedlink.params import ParamSpec


class LazyTrainer:
    """Defers ``build()`` (which loads the client's share and builds its trainer) to the first
    ``train`` (or ``num_examples``) call; thread-safe, built at most once.

    For simulations of many clients over large data: a client that is never sampled never
    loads its share. ``num_examples``, when known without loading (a file loader's labels
    give it), is what ``num_examples()`` answers before the build, so that joining the run
    (which reports it) does not load the share. ``evaluates``: whether the trainer ``build``
    makes has an ``evaluate`` method (federated evaluation, ``fedlink.client.evaluation``);
    said up front, because finding out would load the data at ``Join``.
    """

    def __init__(self, build: Callable[[], Trainer], num_examples: int | None = None,
                 evaluates: bool = False) -> None:
        self._build = build
        self._num_examples = num_examples
        self._evaluates = evaluates
        self._trainer: Trainer | None = None
        self._lock = threading.Lock()

    @property
    def built(self) -> bool:
        """Whether the real trainer (and so the client's data) has been loaded."""
        return self._trainer is not None

    def _get(self) -> Trainer:
        with self._lock:
            if self._trainer is None:
                trainer = self._build()
                if not isinstance(trainer, Trainer):
                    raise ConfigError(f"a lazy trainer's build returned a "
                                      f"{type(trainer).__name__}, expected a fedlink Trainer")
                self._trainer = trainer
            return self._trainer

    def client_state(self) -> Any:
        """The real trainer's ``client_state()`` when it is built and has one (state that
        must outlive a trainer built per task, such as DP-SGD's accountant), else ``None``."""
        keep = None if self._trainer is None else getattr(self._trainer, "client_state", None)
        return None if keep is None else keep()

    def restore_client_state(self, state: Any) -> None:
        """Build the real trainer and hand it ``state`` (when it takes one)."""
        restore = getattr(self._get(), "restore_client_state", None)
        if restore is not None:
            restore(state)

    @property
    def spec(self) -> ParamSpec | None:
        """The real trainer's ``spec`` once it is built and has one (``None`` before)."""
        return None if self._trainer is None else getattr(self._trainer, "spec", None)

    def num_examples(self) -> int:
        """The real trainer's number of examples (building it if needed and not given)."""
        if self._trainer is None and self._num_examples is not None:
            return self._num_examples
        return self._get().num_examples()

    def train(self, params: np.ndarray, plan: TrainPlan) -> TrainResult:
        """Build the real trainer if needed, then train with it."""
        return self._get().train(params, plan)

    @property
    def evaluate(self) -> Callable[[np.ndarray], Mapping[str, float]]:
        """Build the real trainer when first called, then evaluate with it (``AttributeError``
        unless built with ``evaluates``: then this trainer does not evaluate)."""
        if not self._evaluates:
            raise AttributeError("LazyTrainer built without evaluates=True")
        return lambda params: wrapped_evaluate(self._get())(params)
