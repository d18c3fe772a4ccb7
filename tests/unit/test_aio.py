"""``fedlink.aio.cancel_and_wait``: a helper task ends, and a cancellation of the caller is
never swallowed on the way (the trap of ``suppress(CancelledError)`` around the wait)."""

from __future__ import annotations

import asyncio

import pytest

from fedlink.aio import cancel_and_wait


async def _helper(cleanup: asyncio.Event) -> None:
    """Runs until cancelled, then takes until ``cleanup`` is set to end."""
    try:
        await asyncio.Event().wait()
    finally:
        await cleanup.wait()


def test_the_helper_ends_and_the_caller_goes_on() -> None:
    async def main() -> str:
        cleanup = asyncio.Event()
        cleanup.set()
        helper = asyncio.ensure_future(_helper(cleanup))
        await asyncio.sleep(0)
        await cancel_and_wait(helper)
        assert helper.cancelled()
        await cancel_and_wait(helper)  # a no-op once it is done
        return "went on"

    assert asyncio.run(main()) == "went on"


def test_a_cancellation_of_the_caller_while_it_waits_is_raised() -> None:
    async def main() -> None:
        cleanup = asyncio.Event()
        waiting = asyncio.Event()

        async def caller() -> str:
            helper = asyncio.ensure_future(_helper(cleanup))
            await asyncio.sleep(0)
            waiting.set()
            await cancel_and_wait(helper)
            return "went on"  # what suppress(CancelledError) around the wait let happen

        task = asyncio.ensure_future(caller())
        await waiting.wait()
        await asyncio.sleep(0)  # the caller is now waiting for its helper to end
        task.cancel()
        cleanup.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


def test_another_exception_of_the_helper_is_raised() -> None:
    async def main() -> None:
        async def fails() -> None:
            raise ValueError("broken")

        helper = asyncio.ensure_future(fails())
        await asyncio.sleep(0)
        with pytest.raises(ValueError, match="broken"):
            await cancel_and_wait(helper)

    asyncio.run(main())
