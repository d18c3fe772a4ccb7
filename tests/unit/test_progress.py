"""The coordinator's progress lines: one per flush, one when a round is stuck."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from fedlink.coordinator import CoordinatorConfig, FlushRule, LimitsConfig
from fedlink.coordinator.engine import RoundEngine
from fedlink.coordinator.progress import ProgressLog
from fedlink.metrics import EventLog


def test_a_flush_line_says_version_updates_refusals_accuracy_and_time(
        caplog: pytest.LogCaptureFixture) -> None:
    progress = ProgressLog(stuck_after_s=60.0)
    progress.refused()
    progress.refused()
    with caplog.at_level(logging.INFO, logger="fedlink.coordinator"):
        progress.flushed(3, 5, 4.25, {"accuracy": 0.9123})
        progress.flushed(4, 5, 1.0, {})
    first, second = (r.getMessage() for r in caplog.records)
    assert first == ("flush: version 3 from 5 updates (2 refused since the last flush), "
                     "accuracy 0.9123, round 4.2 s")
    assert "(0 refused since the last flush), accuracy n/a" in second


def test_a_stuck_round_is_named_once_with_who_it_waits_for(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = [100.0]
    engine = RoundEngine(CoordinatorConfig(
        rounds=2, flush=FlushRule(goal=3, min_updates=3, deadline_s=None),
        limits=LimitsConfig(stuck_after_s=30.0)), np.zeros(4, np.float32), EventLog(None),
        clock=lambda: clock[0])
    engine.start()
    for client in ("a", "b"):
        engine.issue(client, -1)
    progress = ProgressLog(stuck_after_s=30.0)
    clock[0] += 29.0
    assert not progress.due(engine.version, engine.round_age_s())
    clock[0] += 2.0
    assert progress.due(engine.version, engine.round_age_s())
    with caplog.at_level(logging.WARNING, logger="fedlink.coordinator"):
        progress.stuck(engine.round_state())
    assert not progress.due(engine.version, engine.round_age_s())  # once per version
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("stuck: the round of version 0 has waited 31 s with 0 of goal 3 "
                           "updates in; waiting for a, b.")
    assert "deadline_s" in line and "liveness_timeout_s" in line


def test_no_stuck_line_when_disabled() -> None:
    progress = ProgressLog(stuck_after_s=0.0)
    assert not progress.due(0, 1e9)
