"""The virtual-clock parts: the manual clock, availability windows, link timing."""

from __future__ import annotations

import gc
import math
import weakref

import numpy as np

from fedlink.clock import ManualClock
from fedlink.netem import PRESETS, LinkProfile
from fedlink.sim.virtual.availability import Diurnal, TraceAvailability, finish
from fedlink.sim.virtual.loop import setup_frozen
from fedlink.sim.virtual.timing import DOWN, UP, check_in_time, leg_time, transfer_time


def test_manual_clock_runs_events_in_time_order_ties_in_schedule_order() -> None:
    clock, seen = ManualClock(), []
    clock.call_at(5.0, lambda: seen.append("b"))
    clock.call_at(1.0, lambda: seen.append("a"))
    clock.call_at(5.0, lambda: seen.append("c"))
    cancelled = clock.call_at(2.0, lambda: seen.append("x"))
    cancelled.cancel()
    clock.advance(4.0)
    assert seen == ["a"] and clock.now() == 4.0
    while clock.run_next():
        pass
    assert seen == ["a", "b", "c"] and clock.now() == 5.0


def test_manual_clock_lists_the_calls_still_to_run_without_the_withdrawn_or_run() -> None:
    clock, seen = ManualClock(), []
    clock.call_at(1.0, lambda: seen.append("run"))
    withdrawn = clock.call_at(2.0, lambda: seen.append("withdrawn"))
    kept = lambda: seen.append("kept")  # noqa: E731
    clock.call_at(3.0, kept)
    withdrawn.cancel()
    clock.run_next()
    assert list(clock.scheduled()) == [(3.0, kept)]
    assert seen == ["run"]


def test_work_pauses_while_offline_and_resumes() -> None:
    trace = TraceAvailability({0: [(0.0, 10.0), (70.0, 100.0)]})
    assert finish(trace, 0, 5.0, 10.0) == 75.0  # 5 s before, the rest after the gap
    assert finish(trace, 1, 5.0, 10.0) == 15.0  # no row: always online


def test_diurnal_online_fraction_of_the_day() -> None:
    diurnal = Diurnal(online_fraction=0.25, seed=3)
    hours = [diurnal.online(7, h * 3600.0 + 1.0) for h in range(24)]
    assert 5 <= sum(hours) <= 7
    back = diurnal.next_online(7, 0.0)
    assert diurnal.online(7, back) and math.isfinite(diurnal.next_offline(7, back))


def test_transfer_time_follows_latency_and_bandwidth() -> None:
    link = LinkProfile(latency_ms=100.0, up_kbps=800.0, down_kbps=8000.0)
    up = transfer_time(link, 100_000, UP, None)
    down = transfer_time(link, 100_000, DOWN, None)
    assert math.isclose(up.seconds, 0.2 + 1.0)
    assert math.isclose(down.seconds, 0.2 + 0.1)


def test_a_call_s_two_legs_cost_what_a_transfer_does() -> None:
    # a request reaches the coordinator after one one-way latency and its bytes, as does the
    # answer the client: a call the coordinator holds (a secure phase) costs that plus the wait
    link = LinkProfile(latency_ms=100.0, up_kbps=800.0, down_kbps=8000.0)
    up = leg_time(link, 100_000, UP, None)
    assert math.isclose(up.seconds, 0.1 + 1.0)
    assert math.isclose(up.seconds + leg_time(link, 0, DOWN, None).seconds,
                        transfer_time(link, 100_000, UP, None).seconds)


def test_a_check_in_carries_a_model_that_fits_inline_and_downloads_a_larger_one() -> None:
    link = LinkProfile(latency_ms=100.0, up_kbps=800.0, down_kbps=8000.0)
    task_s, inline = check_in_time(link, 10_000, 64 << 10, None)  # inside the answer
    assert math.isclose(task_s, inline.seconds) and math.isclose(inline.seconds, 0.2 + 0.01)
    task_s, fetched = check_in_time(link, 100_000, 64 << 10, None)  # a download of its own
    assert math.isclose(task_s, 0.2) and math.isclose(fetched.seconds, 0.2 + 0.2 + 0.1)
    task_s, held = check_in_time(link, 0, 64 << 10, None)  # it holds the model: nothing sent
    assert math.isclose(task_s, 0.2) and math.isclose(held.seconds, 0.2)


def test_resets_cost_resent_bytes_and_round_trips() -> None:
    rng = np.random.default_rng(0)
    link = LinkProfile(latency_ms=50.0, up_kbps=1000.0, reset_every_kb=200.0)
    timed = transfer_time(link, 2_000_000, UP, rng)
    assert timed.resets > 0 and timed.resent_bytes > 0
    assert timed.seconds > transfer_time(link, 2_000_000, UP, None).seconds
    assert transfer_time(PRESETS["lan"], 1000, UP, None).seconds < 0.01


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_a_run_freezes_what_existed_only_while_it_runs_and_still_collects_its_cycles() -> None:
    gc.unfreeze()  # an earlier test in this process may have frozen objects (serve does)
    with setup_frozen():
        assert gc.get_freeze_count() > 0
        garbage = weakref.ref(_Node())
        gc.collect()
        assert garbage() is None
    assert gc.get_freeze_count() == 0


def test_a_freeze_made_before_the_run_is_left_as_it_was() -> None:
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        # a frozen object freed meanwhile (a thread an earlier test left, a temporary) leaves
        # the count a little lower; an unfreeze would leave it at 0, a second freeze higher
        with setup_frozen():
            assert 0 < gc.get_freeze_count() <= frozen
        assert 0 < gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()
