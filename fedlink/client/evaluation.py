"""Federated evaluation on the client: which tasks ask a client to score the global model on its
own data (torch-free; the torch trainer does the scoring).

``[coordinator.evaluation] fraction, every`` reach every client as two task options (through
``[coordinator.training] trainer_options``): on model versions that are a multiple of
``every``, a client evaluates the global model it received, on its local data, before training,
with probability ``fraction`` (a coin seeded by the client's seed and the version, so the same
run picks the same clients). It reports ``fed_eval_loss``, ``fed_eval_accuracy`` (when the task
is classification) and ``fed_eval_examples`` with its update; ``fedlink.metrics.federated``
weights them by examples into the run's federated curve and per-client distribution.
"""

from __future__ import annotations

import numpy as np

from fedlink.client.base import TrainPlan
from fedlink.errors import ConfigError

EVERY_OPTION = "fedlink_eval_every"
FRACTION_OPTION = "fedlink_eval_fraction"
PREFIX = "fed_eval_"
"""The metrics a client reports: ``fed_eval_loss``, ``fed_eval_accuracy``, ``fed_eval_examples``."""


def evaluation_due(plan: TrainPlan, client_seed: int) -> bool:
    """Whether this task asks the client to evaluate the global model first."""
    raw_fraction = plan.options.get(FRACTION_OPTION)
    if raw_fraction is None or plan.model_version < 0:
        return False
    try:
        fraction = float(raw_fraction)
        every = int(plan.options.get(EVERY_OPTION, "1"))
    except ValueError as exc:
        raise ConfigError(f"federated evaluation options: {exc}") from exc
    if fraction <= 0 or every < 1 or plan.model_version % every:
        return False
    coin = np.random.default_rng([client_seed & (2**63 - 1), plan.model_version]).random()
    return bool(coin < fraction)
