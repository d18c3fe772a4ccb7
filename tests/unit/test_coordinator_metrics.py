"""Client-reported metrics reach ``update_accepted``; resilience figures, summary and report."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from conftest import FakeClock

from fedlink.coordinator import CoordinatorConfig, FlushRule, RoundEngine
from fedlink.coordinator.client_metrics import MAX_EXTRA_METRICS, event_fields
from fedlink.coordinator.engine import ReceivedUpdate
from fedlink.messages import Task
from fedlink.metrics import EventLog, summarize, write_report
from fedlink.metrics.kinds import SecureGroupLost


def test_known_keys_become_fields_and_bad_values_are_dropped() -> None:
    fields = event_fields({
        "retries": 3.0, "resumed_bytes": 1e6, "offline_seconds": 12.5, "train_seconds": 0.25,
        "train_loss": -0.5, "accuracy": 0.9,
    })
    assert fields == {"retries": 3, "resumed_bytes": 1_000_000, "offline_seconds": 12.5,
                      "train_seconds": 0.25, "train_loss": -0.5,
                      "client_metrics": {"accuracy": 0.9}}
    assert isinstance(fields["retries"], int)
    bad = event_fields({"retries": -1.0, "offline_seconds": math.inf, "train_loss": math.nan,
                        "x" * 65: 1.0, "nan_metric": math.nan})
    assert bad == {}
    many = event_fields({f"m{i:02d}": float(i) for i in range(40)})
    assert len(many["client_metrics"]) == MAX_EXTRA_METRICS


def test_update_accepted_carries_the_clients_report(fake_clock: FakeClock) -> None:
    config = CoordinatorConfig(flush=FlushRule(goal=2, deadline_s=None))
    engine = RoundEngine(config, np.zeros(3, np.float32), EventLog(None), clock=fake_clock)
    task = engine.issue("a")
    assert isinstance(task, Task)
    engine.submit(ReceivedUpdate("a", task.task_id, 0, np.ones(3, np.float32), 1, 1, 1, 12,
                                 metrics={"retries": 4.0, "offline_seconds": 2.0,
                                          "loss": 1.5}))
    (event,) = engine.events.of_kind("update_accepted")
    assert (event["retries"], event["offline_seconds"]) == (4, 2.0)
    assert event["client_metrics"] == {"loss": 1.5}
    assert "resumed_bytes" not in event


def resilient_run() -> list[dict[str, object]]:
    log = EventLog(None)
    log.emit("run_started", config={})
    log.emit("download_finished", client_id="c1", task_id="t1", bytes=4000, delta=False,
             bytes_saved=0)
    log.emit("download_finished", client_id="c1", task_id="t2", bytes=1000, delta=True,
             bytes_saved=3000)
    log.emit("update_accepted", client_id="c1", task_id="t2", staleness=0, bytes_up=10,
             retries=2, resumed_bytes=500, offline_seconds=1.5)
    log.emit("update_accepted", client_id="c2", task_id="t3", staleness=0, bytes_up=10,
             retries=1, offline_seconds=10.0)
    log.emit("update_accepted", client_id="c3", task_id="t4", staleness=0, bytes_up=10)
    return log.events


def test_summary_totals_the_resilience_figures() -> None:
    summary = summarize(resilient_run(), {})
    assert summary["delta_bytes_saved"] == 3000
    assert summary["client_retries_reported"] == 3
    assert summary["resumed_bytes"] == 500
    assert summary["offline_seconds"] == 11.5
    quiet = summarize([], {})
    assert (quiet["delta_bytes_saved"], quiet["client_retries_reported"],
            quiet["resumed_bytes"], quiet["offline_seconds"]) == (0, 0, 0, 0.0)


def test_report_shows_non_zero_resilience_figures_only(tmp_path: Path) -> None:
    events = resilient_run()
    text = write_report(tmp_path / "a", events, summarize(events, {})).read_text()
    assert "| Saved by delta downloads | 3.0 kB |" in text
    assert "| Upload bytes resumed (not resent) | 500 B |" in text
    assert "| Client retries (reported) | 3 |" in text
    assert "| Client time offline (reported) | 11.5 s |" in text
    assert "gave up" not in text
    dropped = write_report(tmp_path / "c", events,
                           {**summarize(events, {}), "clients_gave_up": 2}).read_text()
    assert "| Clients that gave up (retry budget spent) | 2 |" in dropped
    plain = write_report(tmp_path / "b", [], summarize([], {})).read_text()
    assert "delta" not in plain and "resumed" not in plain and "offline" not in plain


def test_a_secure_run_s_summary_counts_its_lost_groups() -> None:
    events = EventLog(None)
    for group in (1, 3):
        events.emit(SecureGroupLost.build(group=group, phase="masked", reason="too few",
                                          members=4, model_version=0))
    secure = {"coordinator": {"secure": {"enabled": True}}}
    assert summarize(events.events, secure)["secure_groups_lost"] == 2
    assert summarize([], secure)["secure_groups_lost"] == 0
    assert summarize(events.events, {})["secure_groups_lost"] is None  # not a secure run
