"""Retry policy for calls to the coordinator: tenacity, exponential backoff with full jitter.

Only errors marked retryable (``UNAVAILABLE``, ``DEADLINE_EXCEEDED``, ``CANCELLED``, and
``RESOURCE_EXHAUSTED`` carrying the coordinator's retry-after hint) are retried, the last never
sooner than the hint says;
``INVALID_ARGUMENT``, ``PERMISSION_DENIED`` and the like are the caller's to handle. Tests swap
the ``sleep`` function instead of sleeping. ``Caller`` runs calls under a policy and counts what
the retrying cost into a session's ``SessionStats``.
"""

from __future__ import annotations

import asyncio
import logging
import numbers
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    RetryError,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)

from fedlink.client.stats import SessionStats
from fedlink.config import from_table, require
from fedlink.errors import RemoteError

log = logging.getLogger(__name__)
T = TypeVar("T")
Sleep = Callable[[float], Awaitable[None]]
Clock = Callable[[], float]


def is_retryable(exc: BaseException) -> bool:
    """Whether a failed call may succeed if tried again.

    ``RESOURCE_EXHAUSTED`` is retryable only with the coordinator's retry-after hint
    (overload); a payload that is too large stays too large.
    """
    return isinstance(exc, RemoteError) and exc.retryable


def _honouring_hint(backoff: Callable[[RetryCallState], float]) -> Callable[[RetryCallState],
                                                                             float]:
    """``backoff``, but never shorter than the retry-after hint of the error just raised."""

    def wait(state: RetryCallState) -> float:
        delay = backoff(state)
        exc = state.outcome.exception() if state.outcome else None
        hint = exc.retry_after_s if isinstance(exc, RemoteError) else None
        return max(delay, hint) if hint is not None else delay

    return wait


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
        for name in ("initial_backoff_s", "max_backoff_s", "budget_s"):
            value = getattr(self, name)
            require(isinstance(value, numbers.Real) and not isinstance(value, bool),
                    f"retry.{name}", f"must be a number, got {value!r}")
        require(isinstance(self.max_attempts, numbers.Integral)
                and not isinstance(self.max_attempts, bool), "retry.max_attempts",
                f"must be an integer, got {self.max_attempts!r}")
        require(self.initial_backoff_s > 0, "retry.initial_backoff_s", "must be > 0")
        require(self.max_backoff_s >= self.initial_backoff_s, "retry.max_backoff_s",
                "must be >= initial_backoff_s")
        require(self.max_attempts >= 1, "retry.max_attempts", "must be >= 1")
        require(self.budget_s > 0, "retry.budget_s", "must be > 0")

    @classmethod
    def from_dict(cls, table: Mapping[str, Any], section: str = "client.retry") -> RetryPolicy:
        """Build from a TOML table such as ``[client.retry]``; unknown keys are a ``ConfigError``.

        Missing keys keep their defaults; values are checked as in the constructor.
        """
        return from_table(cls, table, section)

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
            wait=_honouring_hint(wait_random_exponential(multiplier=self.initial_backoff_s,
                                                         max=self.max_backoff_s)),
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


class Caller:
    """Runs calls under a ``RetryPolicy`` and counts their retries and time offline.

    ``stats.retries`` grows by one per retried attempt; ``stats.offline_seconds`` by the time
    from the start of a call's first failed attempt to the start of the attempt that succeeded
    (or to the moment the policy gave up): failed attempts plus backoff. ``clock`` and ``sleep``
    are injectable so tests neither sleep nor depend on real time.
    """

    def __init__(self, policy: RetryPolicy, stats: SessionStats, sleep: Sleep = asyncio.sleep,
                 clock: Clock = time.monotonic) -> None:
        self.policy = policy
        self.stats = stats
        self._sleep = sleep
        self._clock = clock

    async def __call__(self, fn: Callable[[], Awaitable[T]], what: str) -> T:
        """Run ``fn`` per the policy (``what`` names it in log lines)."""
        started = self._clock()
        offline_until = started  # start of the latest attempt, or when the call gave up
        failed = False

        def on_retry(_: BaseException) -> None:
            nonlocal failed
            failed = True
            self.stats.retries += 1

        async def attempt() -> T:
            nonlocal offline_until
            offline_until = self._clock()
            return await fn()

        try:
            return await self.policy.call(attempt, what=what, sleep=self._sleep,
                                          on_retry=on_retry)
        except BaseException:
            offline_until = self._clock()
            raise
        finally:
            if failed:
                self.stats.offline_seconds += offline_until - started
