"""RetryPolicy: which errors are retried, how long it waits (full jitter), when it gives up.

Never sleeps for real: ``sleep`` is swapped for a recorder, and the budget test moves a fake
clock that tenacity reads.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterator
from types import SimpleNamespace

import pytest
import tenacity

from fedlink.client import RetryPolicy
from fedlink.errors import (
    Cancelled,
    ConfigError,
    DeadlineExceeded,
    InvalidArgument,
    PermissionDenied,
    RemoteError,
    Unauthenticated,
    Unavailable,
    UpdateRefused,
)


class Recorder:
    """A ``sleep`` that records the requested waits and returns at once."""

    def __init__(self, on_sleep: Callable[[float], None] | None = None) -> None:
        self.waits: list[float] = []
        self.on_sleep = on_sleep

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        if self.on_sleep is not None:
            self.on_sleep(seconds)


class Flaky:
    """Fails with ``errors`` in turn, then returns ``"ok"``."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def call(policy: RetryPolicy, fn: Flaky, sleep: Recorder,
         on_retry: Callable[[BaseException], None] | None = None) -> str:
    return asyncio.run(policy.call(fn, what="test", sleep=sleep, on_retry=on_retry))


@pytest.mark.parametrize("error", [Unavailable("down"), DeadlineExceeded("slow"),
                                   Cancelled("cut")], ids=lambda e: e.code)
def test_retryable_errors_are_retried(error: RemoteError) -> None:
    fn, sleep = Flaky(error, error), Recorder()
    seen: list[BaseException] = []
    assert call(RetryPolicy(), fn, sleep, on_retry=seen.append) == "ok"
    assert fn.calls == 3
    assert len(sleep.waits) == 2
    assert seen == [error, error]


@pytest.mark.parametrize("error", [InvalidArgument("bad"), PermissionDenied("no"),
                                   UpdateRefused("stale"), Unauthenticated("who"),
                                   ValueError("a bug")],
                         ids=lambda e: type(e).__name__)
def test_non_retryable_errors_are_raised_at_once(error: Exception) -> None:
    fn, sleep = Flaky(error), Recorder()
    with pytest.raises(type(error)) as raised:
        call(RetryPolicy(), fn, sleep)
    assert raised.value is error
    assert fn.calls == 1
    assert sleep.waits == []


def test_max_attempts_then_last_error_is_raised() -> None:
    errors = [Unavailable(f"down {i}") for i in range(10)]
    fn, sleep = Flaky(*errors), Recorder()
    with pytest.raises(Unavailable, match="down 3"):
        call(RetryPolicy(max_attempts=4), fn, sleep)
    assert fn.calls == 4
    assert len(sleep.waits) == 3


def test_single_attempt_never_sleeps() -> None:
    fn, sleep = Flaky(Unavailable("down")), Recorder()
    with pytest.raises(Unavailable):
        call(RetryPolicy(max_attempts=1), fn, sleep)
    assert sleep.waits == []


@pytest.fixture
def seeded_random() -> Iterator[None]:
    """tenacity draws its jitter from the global ``random``: seed it, then restore it."""
    state = random.getstate()
    random.seed(1234)
    yield
    random.setstate(state)


@pytest.mark.usefixtures("seeded_random")
def test_waits_are_full_jitter_within_exponential_bounds() -> None:
    policy = RetryPolicy(initial_backoff_s=0.1, max_backoff_s=2.0, max_attempts=40)
    fn, sleep = Flaky(*[Unavailable("down")] * 39), Recorder()
    assert call(policy, fn, sleep) == "ok"
    assert len(sleep.waits) == 39
    for n, wait in enumerate(sleep.waits):
        bound = min(2.0, 0.1 * 2**n)
        assert 0.0 <= wait <= bound, (n, wait, bound)
    # jitter: the capped waits are spread over [0, cap], not pinned to it
    capped = sleep.waits[6:]
    assert min(capped) < 1.0 < max(capped)
    assert len(set(capped)) == len(capped)


def test_budget_stops_retrying(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    monkeypatch.setattr(tenacity, "time", SimpleNamespace(monotonic=lambda: now[0]))

    class SlowDown(Flaky):
        async def __call__(self) -> str:
            now[0] += 10.0  # each attempt takes 10 s of (fake) time
            return await super().__call__()

    def advance(seconds: float) -> None:
        now[0] += seconds

    fn = SlowDown(*[Unavailable(f"down {i}") for i in range(50)])
    sleep = Recorder(on_sleep=advance)
    policy = RetryPolicy(initial_backoff_s=0.1, max_backoff_s=0.1, max_attempts=50,
                         budget_s=25.0)
    with pytest.raises(Unavailable, match="down 2"):
        call(policy, fn, sleep)
    assert fn.calls == 3  # at 10 s and ~20 s it retries; at ~30 s the budget is spent
    assert len(sleep.waits) == 2


@pytest.mark.parametrize("kwargs", [
    {"initial_backoff_s": 0.0},
    {"initial_backoff_s": 1.0, "max_backoff_s": 0.5},
    {"max_attempts": 0},
    {"budget_s": 0.0},
])
def test_invalid_policy_is_config_error(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError, match=r"retry\."):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]
