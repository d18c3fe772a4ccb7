"""Private files: run folders and state dirs only their owner reads (0700), files 0600.

A run folder holds the event log, the summary and the final model; a state dir holds every
pending raw client update. Other users on the machine have no business reading either, so
fedlink makes its folders ``0700`` and its files ``0600`` whatever the process's umask.
A leaf module (stdlib only), like ``fedlink.atomic``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from pathlib import Path

log = logging.getLogger(__name__)

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) if missing and make it ``0700``; returns ``path``."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    os.chmod(path, DIR_MODE)
    return path


def private_file(path: Path) -> Path:
    """Make an existing file ``0600`` (a missing one is left alone); returns ``path``."""
    with contextlib.suppress(FileNotFoundError):
        os.chmod(path, FILE_MODE)
    return path


def touch_private(path: Path) -> Path:
    """Create ``path`` empty with mode ``0600`` if it does not exist, else make it ``0600``."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, FILE_MODE))
    return private_file(path)


def warn_if_loose(path: str | Path, what: str) -> bool:
    """Log a loud warning, with the fix, when the secret file ``path`` is readable by group or
    others; returns whether it was. A missing file is left to the caller to report."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    if not mode & (stat.S_IRWXG | stat.S_IRWXO):
        return False
    log.warning("INSECURE: %s %s is readable by other users (mode %o); anyone on this machine "
                "can read the secret: run 'chmod 600 %s'", what, path, stat.S_IMODE(mode), path)
    return True
