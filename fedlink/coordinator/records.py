"""The coordinator's plain records: clients, tasks and received updates.

They live in their own module because three parts of the coordinator share them: the round
engine and the client registry mutate them, and the durable state store
(``fedlink.coordinator.state``) writes them to disk and reads them back after a restart.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from fedlink.coordinator.tasks import TaskState, checked_move


@dataclass
class ClientRecord:
    """One client the coordinator knows.

    ``instance_key``: the key the client instance sent at ``Join`` (empty if none); a repeated
    ``Join`` with the same name and key is the same client.
    """

    client_id: str
    name: str
    num_examples: int
    joined_at: float
    last_seen: float
    metadata: Mapping[str, str] = field(default_factory=dict)
    instance_key: str = ""


@dataclass
class TaskRecord:
    """One task issued to one client, for one model version (``version``: data, never read
    back from ``task_id``). ``state`` moves only through ``move`` (``fedlink.coordinator.tasks``
    holds the legal moves). ``delta_base``: the version the offered delta starts from (-1:
    none)."""

    task_id: str
    client_id: str
    version: int
    issued_at: float
    state: TaskState = TaskState.ISSUED
    delta_base: int = -1

    def move(self, to: TaskState) -> None:
        """Go to state ``to`` (``IllegalTransition`` when the state machine does not go there)."""
        self.state = checked_move(self.task_id, self.state, to)


@dataclass(frozen=True)
class ReceivedUpdate:
    """A decoded, validated client update, ready to be folded in."""

    client_id: str
    task_id: str
    base_version: int
    delta: np.ndarray
    num_examples: int
    steps_completed: int
    steps_planned: int
    bytes_up: int
    metrics: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class SummedTask:
    """A task whose update is inside a secure group's sum: what it claimed, never its data."""

    client_id: str
    task_id: str
    num_examples: int = 0
    steps_completed: int = 0
    steps_planned: int = 0
    bytes_up: int = 0
    staleness: int = 0
    """Versions its model was behind when the group's roster closed."""
    weight: float = 1.0
    """The staleness weight it summed its update with (``[w * update, w]``)."""
