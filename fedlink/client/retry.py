"""Retry policy for calls to the coordinator: tenacity, exponential backoff with full jitter.

Only errors marked retryable (``UNAVAILABLE``, ``DEADLINE_EXCEEDED``, ``CANCELLED``, and
``RESOURCE_EXHAUSTED`` carrying the coordinator's retry-after hint) are retried, the last never
sooner than the hint says;
``INVALID_ARGUMENT``, ``PERMISSION_DENIED`` and the like are the caller's to handle. Tests swap
the ``sleep`` function instead of sleeping. ``Caller`` runs calls under a policy and counts what
the retrying cost into a session's ``SessionStats``.
"""

from __future__ import annotations

import logging
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
    stop_never,
    wait_random_exponential,
)
from tenacity.stop import stop_base

from fedlink.client.stats import SessionStats
from fedlink.clock import RealClock, real_sleep
from fedlink.config import check_fields, from_table, require
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
    seconds, whichever comes first, and the last error is raised (a warning says what was
    tried, for how long, and the last error). ``keep_trying = true`` never gives up on a
    retryable error (the budget and attempt limit are ignored; the backoff stays capped at
    ``max_backoff_s``): for devices that should wait out any outage.
    """

    initial_backoff_s: float = 0.2
    max_backoff_s: float = 10.0
    max_attempts: int = 20
    budget_s: float = 120.0
    keep_trying: bool = False

    def __post_init__(self) -> None:
        check_fields(self, "client.retry")
        require(self.initial_backoff_s > 0, "client.retry.initial_backoff_s", "must be > 0")
        require(self.max_backoff_s >= self.initial_backoff_s, "client.retry.max_backoff_s",
                "must be >= initial_backoff_s")
        require(self.max_attempts >= 1, "client.retry.max_attempts", "must be >= 1")
        require(self.budget_s > 0, "client.retry.budget_s", "must be > 0")

    def stop(self) -> stop_base:
        """Tenacity's stop condition for this policy."""
        if self.keep_trying:
            return stop_never
        return stop_after_attempt(self.max_attempts) | stop_after_delay(self.budget_s)

    def describe(self) -> str:
        """The policy in words, for a give-up message."""
        if self.keep_trying:
            return "keep trying"
        return f"at most {self.max_attempts} attempts within {self.budget_s:g} s"

    @classmethod
    def from_dict(cls, table: Mapping[str, Any], section: str = "client.retry") -> RetryPolicy:
        """Build from a TOML table such as ``[client.retry]``; unknown keys are a ``ConfigError``.

        Missing keys keep their defaults; values are checked as in the constructor.
        """
        return from_table(cls, table, section)

    async def call(self, fn: Callable[[], Awaitable[T]], *, what: str = "call",
                   sleep: Sleep = real_sleep,
                   on_retry: Callable[[BaseException], None] | None = None,
                   clock: Clock | None = None) -> T:
        """Run ``fn`` until it succeeds, a non-retryable error, or the policy gives up
        (``clock`` times the give-up message; real by default)."""
        now = clock or RealClock().now

        def before_sleep(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            log.info("%s failed (attempt %d): %s; retrying", what, state.attempt_number, exc)
            if on_retry is not None and exc is not None:
                on_retry(exc)

        retrying = AsyncRetrying(
            stop=self.stop(),
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

        started = now()
        try:
            return await retrying(attempt)
        except RetryError as exc:  # only without reraise; kept for safety
            raise exc.last_attempt.result() from exc
        except RemoteError as exc:
            if exc.retryable:  # the policy gave up: say so, with what it tried
                stats = retrying.statistics
                log.warning("giving up on %s after %s attempts over %.1f s (retry policy: %s; "
                            "[client.retry] or --retry-* change it); last error: %s", what,
                            stats.get("attempt_number", "?"), now() - started,
                            self.describe(), exc)
            raise


class Caller:
    """Runs calls under a ``RetryPolicy`` and counts their retries and time offline.

    ``stats.retries`` grows by one per retried attempt; ``stats.offline_seconds`` by the time
    the client could not reach the coordinator: the backoff waits, and failed attempts of
    short calls. A failed attempt of a transfer (``transfer=True``) is not offline time: it
    moved bytes until the break, and the resume keeps them. ``clock`` and ``sleep`` are
    injectable so tests neither sleep nor depend on real time.
    """

    def __init__(self, policy: RetryPolicy, stats: SessionStats, sleep: Sleep = real_sleep,
                 clock: Clock | None = None) -> None:
        self.policy = policy
        self.stats = stats
        self._sleep = sleep
        self._clock = clock or RealClock().now

    async def __call__(self, fn: Callable[[], Awaitable[T]], what: str,
                       transfer: bool = False) -> T:
        """Run ``fn`` per the policy (``what`` names it in log lines)."""
        attempt_started = self._clock()

        def on_retry(_: BaseException) -> None:
            self.stats.retries += 1
            if not transfer:
                self.stats.offline_seconds += self._clock() - attempt_started

        async def attempt() -> T:
            nonlocal attempt_started
            attempt_started = self._clock()
            return await fn()

        async def backoff(seconds: float) -> None:
            started = self._clock()
            try:
                await self._sleep(seconds)
            finally:
                self.stats.offline_seconds += self._clock() - started

        try:
            return await self.policy.call(attempt, what=what, sleep=backoff,
                                          on_retry=on_retry, clock=self._clock)
        except RemoteError as exc:
            if exc.retryable and not transfer:  # the last attempt, when the policy gave up
                self.stats.offline_seconds += self._clock() - attempt_started
            raise
