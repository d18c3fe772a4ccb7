"""The privacy stage contract: what happens to a client's delta before it is compressed.

Privacy runs **before** compression: compression is then post-processing of an already
privatised update and cannot weaken the guarantee. ``fedlink.client.pipeline.UpdatePipeline``
makes the other order impossible: a privacy stage maps a float vector to a float vector, a
codec maps a float vector to bytes, and the pipeline only chains them in that order.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping

import numpy as np

from fedlink.registry import Registry


class UpdatePrivacy(ABC):
    """Transforms a client's delta (clipping, noise) before it leaves the device."""

    name: str = ""

    @abstractmethod
    def apply(self, delta: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The privatised delta (a new array; ``delta`` is left unchanged)."""

    def configure(self, options: Mapping[str, str]) -> None:  # noqa: B027 (optional hook)
        """Take per-task settings the coordinator sent (an adaptive clip norm, say).

        Called before ``apply`` with the task's options; unknown keys are ignored. The default
        takes nothing.
        """

    def metrics(self) -> dict[str, float]:
        """What the last ``apply`` reports with the update (commit metrics); ``{}`` by default.

        Only figures that are safe to release belong here (a clipped-or-not bit that the
        coordinator aggregates with noise, never an update norm).
        """
        return {}


PRIVACY_STAGES: Registry[UpdatePrivacy] = Registry("privacy stage")


@PRIVACY_STAGES.register("none")
class NoPrivacy(UpdatePrivacy):
    """No clipping and no noise: the delta leaves as it is."""

    name = "none"

    def apply(self, delta: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """``delta`` itself (copied)."""
        return np.array(delta, dtype=np.float32, copy=True)
