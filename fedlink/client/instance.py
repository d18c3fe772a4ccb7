"""What a client keeps in its state directory about itself: its instance key, and whether
the coordinator told it the run is over.

The instance key is sent at every ``Join`` so that a repeated one is idempotent.

A ``Join`` whose reply was lost (a cut connection, a ping timeout on a long link) is retried;
without a key each attempt that reached the coordinator registered a new client. With one, the
coordinator answers a repeat with the same client id. The key is random (unguessable: it is
what makes a repeat "the same client"), drawn once per session, or once per state directory
when the client has one, so that a restarted process is still the same instance.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

from fedlink.atomic import write_atomic

KEY_FILE = "instance_key"


def instance_key(state_dir: Path | None) -> str:
    """The key kept in ``state_dir`` (created on first use), or a fresh one without a dir."""
    if state_dir is None:
        return secrets.token_hex(16)
    path = Path(state_dir) / KEY_FILE
    try:
        key = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        key = ""
    if len(key) == 32 and all(c in "0123456789abcdef" for c in key):
        return key
    key = secrets.token_hex(16)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, [key.encode("ascii")])
    return key


FINISHED_FILE = "run_finished.json"
"""Where a client with a state directory remembers that the coordinator said the run is over."""


def remember_finished(state_dir: Path | None, target: str, run_name: str, reason: str) -> None:
    """Keep "the run at ``target`` is over" in ``state_dir`` (nothing without one)."""
    if state_dir is None:
        return
    record = {"target": target, "run_name": run_name, "reason": reason}
    write_atomic(Path(state_dir) / FINISHED_FILE, [json.dumps(record).encode()])


def finished_before(state_dir: Path | None, target: str) -> str | None:
    """The reason an earlier answer of ``target`` gave for the end of its run, if one was kept.

    A client restarted after the run ended, that finds the coordinator gone, exits 0 with
    this reason instead of failing.
    """
    if state_dir is None:
        return None
    try:
        record = json.loads((Path(state_dir) / FINISHED_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("target") != target:
        return None
    return str(record.get("reason") or "run finished")


def forget_finished(state_dir: Path | None) -> None:
    """Drop a kept "run over" (the coordinator runs a run again)."""
    if state_dir is not None:
        (Path(state_dir) / FINISHED_FILE).unlink(missing_ok=True)
