"""Waking callers that wait for a change (long-polling ``GetTask``, the drain after the run).

A small object the coordinator's pieces share: whoever changes something a waiting caller may
care about (a place freed, a new version, a client left, the run's end) calls ``notify``.
"""

from __future__ import annotations

import asyncio


class ChangeSignal:
    """One ``asyncio.Event`` per change: ``notify`` sets the current one and starts a new one,
    so a waiter that took ``changed`` before checking never misses a change after it."""

    def __init__(self) -> None:
        self._changed = asyncio.Event()

    @property
    def changed(self) -> asyncio.Event:
        """Set at the next change; take it before checking, then wait on it."""
        return self._changed

    def notify(self) -> None:
        """Wake every waiter."""
        self._changed.set()
        self._changed = asyncio.Event()
