"""A client instance's stable key, sent at every ``Join`` so that a repeated one is idempotent.

A ``Join`` whose reply was lost (a cut connection, a ping timeout on a long link) is retried;
without a key each attempt that reached the coordinator registered a new client. With one, the
coordinator answers a repeat with the same client id. The key is random (unguessable: it is
what makes a repeat "the same client"), drawn once per session, or once per state directory
when the client has one, so that a restarted process is still the same instance.
"""

from __future__ import annotations

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
