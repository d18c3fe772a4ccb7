"""The coordinator's durable state: a journal of its changes, and a restore after a restart.

``open_store(state_dir)`` gives the ``SqliteStore`` for a folder, or the ``NullStore`` (nothing
kept) for an empty ``state_dir``. See ``base.py`` for the contract and ``sqlite.py`` for the
layout on disk.
"""

from __future__ import annotations

from pathlib import Path

from fedlink.coordinator.faults import NO_FAULTS, FaultPlan
from fedlink.coordinator.state.base import (
    STATE_STORES,
    Checkpoint,
    FlushRecord,
    NullStore,
    SavedState,
    SettledUpload,
    StateStore,
)
from fedlink.coordinator.state.sqlite import DB_FILENAME, SqliteStore


def holds_state(state_dir: str) -> bool:
    """Whether ``state_dir`` already holds a coordinator's state (a restart resumes it)."""
    return bool(state_dir) and (Path(state_dir) / DB_FILENAME).is_file()


def open_store(state_dir: str, faults: FaultPlan = NO_FAULTS) -> StateStore:
    """The store for ``state_dir``: SQLite in that folder (telling ``faults`` its moments), or
    nothing kept when it is empty."""
    if not state_dir:
        return STATE_STORES.create("memory")
    return STATE_STORES.create("sqlite", state_dir=state_dir, faults=faults)


__all__ = [
    "STATE_STORES",
    "Checkpoint",
    "FlushRecord",
    "NullStore",
    "SavedState",
    "SettledUpload",
    "SqliteStore",
    "StateStore",
    "holds_state",
    "open_store",
]
