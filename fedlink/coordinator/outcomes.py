"""The coordinator's events about what became of an update and of a round, built in one place.

Two drivers run the round engine: the gRPC service (``Commits`` refuses updates,
``FlushReporter`` reports flushes) and the virtual loop (``fedlink.sim.virtual.loop``), which
plays the coordinator on a manual clock. Both build their ``update_refused`` and ``flush``
events here, count a round's downloaded bytes with ``RoundBytesDown`` and score each new
version with ``central_metrics``, so the two logs agree field for field by construction.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from fedlink.coordinator.client_metrics import DURATIONS, reported_counters
from fedlink.coordinator.downloads import DELTA, EVALUATION, MODEL
from fedlink.coordinator.engine import FlushOutcome
from fedlink.errors import RemoteError
from fedlink.metrics import kinds

log = logging.getLogger(__name__)

KINDS = (MODEL, DELTA, EVALUATION)
"""The kinds of payload a round's downloads are split into (``bytes_down_<kind>``)."""

Evaluator = Callable[[np.ndarray], Mapping[str, float]]


def update_refused(client_id: str, task_id: str, err: RemoteError, bytes_up: int,
                   metrics: Mapping[str, float]) -> kinds.UpdateRefused:
    """The ``update_refused`` event of an update ``err`` refused: why, what it sent, and
    what its client reported about the task (resilience counters, training and network
    seconds; figures that are not finite and >= 0 are left out)."""
    durations = {name: float(metrics[name]) for name in DURATIONS
                 if name in metrics and np.isfinite(metrics[name]) and metrics[name] >= 0}
    return kinds.UpdateRefused.build(client_id=client_id, task_id=task_id, reason=err.detail,
                                     reason_code=err.refusal, code=err.code, bytes_up=bytes_up,
                                     **{**durations, **reported_counters(metrics)})


def flush_fields(outcome: FlushOutcome, bytes_down: Mapping[str, int],
                 metrics: Mapping[str, Any]) -> dict[str, Any]:
    """The ``flush`` event's fields for ``outcome``: the round's ``bytes_down`` counters
    (``RoundBytesDown.take``), its hooks' reports and the central evaluator's ``metrics``."""
    return {"model_version": outcome.version, "num_updates": outcome.num_updates,
            "total_weight": outcome.total_weight, "round_seconds": outcome.round_seconds,
            "bytes_up": outcome.bytes_up, **bytes_down, "updates": list(outcome.task_ids),
            **dict(outcome.hook_report), **metrics}


def central_metrics(evaluator: Evaluator | None, model: np.ndarray) -> dict[str, Any]:
    """The evaluator's scores of ``model`` (none without one). An evaluator that raises is
    logged and recorded in the flush (``evaluation_error``): a user's bug must not stop
    training, and no accuracy must not be a silent None."""
    if evaluator is None:
        return {}
    try:
        return dict(evaluator(model))
    except Exception as exc:  # a user's evaluator: recorded, not raised
        log.exception("evaluating the global model failed")
        return {kinds.EVALUATION_ERROR: f"{type(exc).__name__}: {exc}"}


class RoundBytesDown:
    """The payload bytes sent since the last flush, in all and by kind (model, delta,
    evaluation), as each ``flush`` event carries them."""

    def __init__(self) -> None:
        self._counts = _no_bytes_down()

    def sent(self, kind: str, num_bytes: int) -> None:
        """``num_bytes`` of a ``kind`` payload were sent."""
        self._counts["bytes_down"] += num_bytes
        self._counts[f"bytes_down_{kind}"] += num_bytes

    def take(self) -> dict[str, int]:
        """The counts so far (a flush's), starting the next round's from zero."""
        counts, self._counts = self._counts, _no_bytes_down()
        return counts


def _no_bytes_down() -> dict[str, int]:
    """A round's ``bytes_down`` counters, all zero."""
    return dict.fromkeys(("bytes_down", *(f"bytes_down_{kind}" for kind in KINDS)), 0)
