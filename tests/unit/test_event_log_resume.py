"""A coordinator restarted from its ``state_dir`` appends to its run's event log: the new
process's ``elapsed`` goes on from the run's first event, downtime included, so that the
run's times (``wall_seconds``, a round's seconds, a time to target) span every process."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedlink.metrics.events import EventLog, read_events
from fedlink.metrics.summary import summarize


class Clocks:
    """A process's monotonic clock (its own origin) and the shared wall clock."""

    def __init__(self, wall: float, monotonic: float) -> None:
        self.wall, self.mono = wall, monotonic

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds


def _log(path: Path, clocks: Clocks, resume: bool = True) -> EventLog:
    return EventLog(path, clock=lambda: clocks.mono, wall_clock=lambda: clocks.wall,
                    resume=resume)


def test_a_restarted_process_continues_the_runs_elapsed_time_downtime_included(
        tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    first = Clocks(wall=1_000.0, monotonic=50.0)
    with _log(path, first) as log:
        log.emit("run_started")
        first.advance(1.0)
        log.emit("task_issued", client_id="c0", task_id="t0", model_version=0)
        first.advance(2.0)
        log.emit("flush", model_version=1)
    # down for 6 s; the new process's monotonic clock has another origin
    second = Clocks(wall=first.wall + 6.0, monotonic=7.0)
    with _log(path, second) as log:
        log.emit("run_started", resumed_from_version=1)
        second.advance(1.0)
        log.emit("run_finished", reason="rounds")
    elapsed = [e["elapsed"] for e in read_events(path)]
    assert elapsed == pytest.approx([0.0, 1.0, 3.0, 9.0, 10.0])
    assert summarize(read_events(path), {})["wall_seconds"] == pytest.approx(9.0)


def _first_process(path: Path, seconds: float) -> None:
    """A first process's log: ``run_started`` at wall time 1,000, a flush ``seconds`` on."""
    first = Clocks(wall=1_000.0, monotonic=0.0)
    with _log(path, first) as log:
        log.emit("run_started")
        first.advance(seconds)
        log.emit("flush", model_version=1)


def test_a_wall_clock_set_back_never_takes_elapsed_behind_the_last_event(
        tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    _first_process(path, 5.0)
    with _log(path, Clocks(wall=900.0, monotonic=0.0)) as log:
        log.emit("run_started")
    assert [e["elapsed"] for e in read_events(path)] == pytest.approx([0.0, 5.0, 5.0])


def test_a_torn_last_line_is_cut_before_appending_and_a_new_log_starts_at_zero(
        tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    _first_process(path, 4.0)
    with path.open("a", encoding="utf-8") as f:
        f.write('{"t": 1004.5, "elapsed": 4.5, "ki')  # killed mid-line
    with _log(path, Clocks(wall=1_010.0, monotonic=0.0)) as log:
        assert log.elapsed() == pytest.approx(10.0)
        assert [e["kind"] for e in log.earlier({"run_started", "flush"})] == [
            "run_started", "flush"]
        log.emit("run_started")
    # the torn fragment was cut, not glued to the next event: the whole log reads
    assert [e.kind for e in read_events(path)] == ["run_started", "flush", "run_started"]
    with _log(tmp_path / "fresh.jsonl", Clocks(wall=1_010.0, monotonic=3.0)) as log:
        assert log.elapsed() == 0.0


def test_a_log_appended_to_without_resume_keeps_its_own_clock_and_ends_lines_cleanly(
        tmp_path: Path) -> None:
    """Appending is not resuming (a benchmark may append runs on a model clock to one
    file): only ``resume=True`` continues the earlier ``elapsed``. A whole last event that
    lacks its newline is kept, and the next one starts on a line of its own."""
    path = tmp_path / "events.jsonl"
    first = Clocks(wall=1_000.0, monotonic=0.0)
    with _log(path, first, resume=False) as log:
        first.advance(5_000.0)
        log.emit("run_started")
    path.write_bytes(path.read_bytes().rstrip(b"\n"))  # a writer that left no newline
    with _log(path, Clocks(wall=9_000.0, monotonic=0.0), resume=False) as log:
        assert log.elapsed() == 0.0
        log.emit("run_finished", reason="done")
    assert [(e.kind, e["elapsed"]) for e in read_events(path)] == [
        ("run_started", 5_000.0), ("run_finished", 0.0)]
