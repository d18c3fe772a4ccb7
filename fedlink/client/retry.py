"""Retry policy for calls to the coordinator: tenacity, exponential backoff with full jitter.

Only errors marked retryable (``UNAVAILABLE``, ``DEADLINE_EXCEEDED``, ``CANCELLED``) are retried;
``INVALID_ARGUMENT``, ``PERMISSION_DENIED`` and the like are the caller's to handle. Tests swap
the ``sleep`` function instead of sleeping.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    RetryError,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)

from fedlink.config import require
from fedlink.errors import RemoteError

log = logging.getLogger(__name__)
T = TypeVar("T")
Sleep = Callable[[float], Awaitable[None]]


def is_retryable(exc: BaseException) -> bool:
    """Whether a failed call may succeed if tried again."""
    return isinstance(exc, RemoteError) and exc.retryable


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter, a cap, an attempt limit and a total time budget.

    The wait before attempt ``n`` is uniform in ``[0, min(max_backoff_s, initial_backoff_s *
    2**n)]`` (AWS's "full jitter"); retrying stops after ``max_attempts`` or ``budget_s``
    seconds, whichever comes first, and the last error is raised.
    """

    initial_backoff_s: float = 0.2
    max_backoff_s: float = 10.0
    max_attempts: int = 20
    budget_s: float = 120.0

    def __post_init__(self) -> None:
        require(self.initial_backoff_s > 0, "retry.initial_backoff_s", "must be > 0")
        require(self.max_backoff_s >= self.initial_backoff_s, "retry.max_backoff_s",
                "must be >= initial_backoff_s")
        require(self.max_attempts >= 1, "retry.max_attempts", "must be >= 1")
        require(self.budget_s > 0, "retry.budget_s", "must be > 0")

    async def call(self, fn: Callable[[], Awaitable[T]], *, what: str = "call",
                   sleep: Sleep = asyncio.sleep,
                   on_retry: Callable[[BaseException], None] | None = None) -> T:
        """Run ``fn`` until it succeeds, a non-retryable error, or the policy gives up."""

        def before_sleep(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            log.info("%s failed (attempt %d): %s; retrying", what, state.attempt_number, exc)
            if on_retry is not None and exc is not None:
                on_retry(exc)

        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.max_attempts) | stop_after_delay(self.budget_s),
            wait=wait_random_exponential(multiplier=self.initial_backoff_s,
                                         max=self.max_backoff_s),
            retry=retry_if_exception(is_retryable),
            sleep=sleep,
            before_sleep=before_sleep,
            reraise=True,
        )
        async def attempt() -> T:
            # tenacity awaits only coroutine functions; ``fn`` may be a lambda.
            return await fn()

        try:
            return await retrying(attempt)
        except RetryError as exc:  # only without reraise; kept for safety
            raise exc.last_attempt.result() from exc
