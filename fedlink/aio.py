"""Ending a helper task from async code without losing a cancellation of one's own.

The usual ``task.cancel(); with suppress(CancelledError): await task`` has a trap: if the
caller is itself cancelled while it waits there, asyncio delivers that ``CancelledError`` at
the same ``await``, the ``suppress`` swallows it, and the caller goes on as if it had never
been cancelled. A client session cancelled between two tasks could then keep checking in,
and whatever gathered it wait for ever. ``cancel_and_wait`` swallows only the helper's own
cancellation. A leaf module: it imports nothing of fedlink.
"""

from __future__ import annotations

import asyncio
from typing import Any


async def cancel_and_wait(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` (a no-op once it is done) and wait until it has ended.

    Its own ``CancelledError`` is swallowed; one aimed at the caller (``Task.cancelling``)
    is raised. Any other exception the task ended with is raised, as awaiting it would.
    """
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
