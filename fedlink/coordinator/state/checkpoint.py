"""Model checkpoints: one ``.npz`` file per version, written atomically.

A checkpoint holds the model vector and the engine state after the flush that made it (the
server optimizer's and flush hooks' ``state_dict``s: nested dicts and lists of JSON scalars and
numpy arrays). The arrays go into the archive as themselves; the structure around them goes in
as JSON, with each array replaced by a reference. Loading uses ``allow_pickle=False``: a
checkpoint is data, never code.

Atomic means a reader finds either the whole previous file or the whole new one: the bytes are
written to a temporary file in the same folder, fsynced, renamed over the final name, and the
folder is fsynced so that the rename itself survives a power loss.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import numpy as np

from fedlink.atomic import TEMP_SUFFIX, write_atomic
from fedlink.coordinator.state.base import Checkpoint

_MODEL = "model"
_META = "meta"
_ARRAY_KEY = "__ndarray__"
_NAME = re.compile(r"^v(\d{9})\.npz$")


def checkpoint_path(folder: Path, version: int) -> Path:
    """Where the checkpoint of ``version`` lives in ``folder``."""
    return folder / f"v{version:09d}.npz"


def saved_versions(folder: Path) -> list[int]:
    """Versions with a checkpoint file in ``folder``, ascending."""
    found = (_NAME.match(p.name) for p in folder.glob("v*.npz"))
    return sorted(int(m[1]) for m in found if m)


def write_checkpoint(folder: Path, checkpoint: Checkpoint) -> Path:
    """Write ``checkpoint`` atomically (write, fsync, rename, fsync the folder)."""
    arrays: dict[str, np.ndarray] = {}
    meta = {"version": checkpoint.version, "state": _extract(checkpoint.engine_state, arrays)}
    arrays[_MODEL] = np.ascontiguousarray(checkpoint.model, dtype=np.float32)
    arrays[_META] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **cast(dict[str, Any], arrays))
    final = checkpoint_path(folder, checkpoint.version)
    write_atomic(final, [buffer.getbuffer()])
    return final


def read_checkpoint(folder: Path, version: int) -> Checkpoint:
    """The checkpoint of ``version`` (``FileNotFoundError`` when there is none)."""
    with np.load(checkpoint_path(folder, version), allow_pickle=False) as archive:
        meta = json.loads(bytes(archive[_META]).decode())
        arrays = {name: archive[name] for name in archive.files}
    return Checkpoint(int(meta["version"]), arrays[_MODEL], _restore(meta["state"], arrays))


def delete_checkpoints_before(folder: Path, version: int) -> None:
    """Remove the checkpoints of versions older than ``version`` (and stray temporaries)."""
    for old in saved_versions(folder):
        if old < version:
            checkpoint_path(folder, old).unlink(missing_ok=True)
    for stray in folder.glob(f".v*{TEMP_SUFFIX}"):
        stray.unlink(missing_ok=True)


def _extract(value: Any, arrays: dict[str, np.ndarray]) -> Any:
    """``value`` as JSON, each numpy array moved into ``arrays`` and replaced by a reference."""
    if isinstance(value, np.ndarray):
        key = f"a{len(arrays)}"
        arrays[key] = value
        return {_ARRAY_KEY: key}
    if isinstance(value, Mapping):
        return {str(k): _extract(v, arrays) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_extract(v, arrays) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _restore(value: Any, arrays: Mapping[str, np.ndarray]) -> Any:
    """The inverse of ``_extract``."""
    if isinstance(value, dict):
        if set(value) == {_ARRAY_KEY}:
            return arrays[value[_ARRAY_KEY]]
        return {k: _restore(v, arrays) for k, v in value.items()}
    if isinstance(value, list):
        return [_restore(v, arrays) for v in value]
    return value
