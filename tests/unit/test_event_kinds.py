"""Typed events: one type per kind, written and read through it; subscribers; the flush watch."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from fedlink.metrics import EventLog, read_events
from fedlink.metrics.kinds import (
    EVENT_TYPES,
    ClientNetwork,
    Flush,
    OtherEvent,
    TaskIssued,
    UpdateAccepted,
    from_record,
    make_event,
)
from fedlink.sim.watch import FlushWatch

ROOT = Path(__file__).resolve().parents[2]


def _emit_calls() -> tuple[set[str], set[str]]:
    """(kinds fedlink's code emits by name, ``emit("kind", ...)``; event classes it emits,
    ``emit(kinds.X(...))`` or ``emit(kinds.X.build(...))``)."""
    by_name, by_type = set(), set()
    for path in (ROOT / "fedlink").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "emit" and node.args):
                continue
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                by_name.add(first.value)
            elif isinstance(first, ast.Call):
                built = first.func
                if isinstance(built, ast.Attribute) and built.attr == "build":
                    built = built.value
                name = built.attr if isinstance(built, ast.Attribute) else \
                    built.id if isinstance(built, ast.Name) else ""
                if name[:1].isupper():  # a class: kinds.X(...) (not a method making one)
                    by_type.add(name)
    return by_name, by_type


def test_every_writer_emits_a_typed_event_of_the_table() -> None:
    by_name, by_type = _emit_calls()
    assert by_name == set(), "writers pass typed events, not kind names"
    classes = {cls.__name__ for cls in EVENT_TYPES.values()}
    assert {"TaskIssued", "UpdateAccepted", "Flush", "RunFinished"} <= by_type <= classes
    assert {"coordinator_restored", "client_network", "client_expired",
            "flush_refused"} <= set(EVENT_TYPES)


def test_the_string_form_is_checked_against_the_kind() -> None:
    log = EventLog(None)
    with pytest.raises(ValueError, match="unknown event kind 'task_isued'"):
        log.emit("task_isued", client_id="a")
    with pytest.raises(ValueError, match=r"task_issued event has no field.*model_versoin"):
        log.emit("task_issued", client_id="a", task_id="t1", model_versoin=3)
    assert log.count() == 0 and log.events == []
    event = log.emit("task_issued", client_id="a", task_id="t1", model_version=3)
    assert isinstance(event, TaskIssued) and event.model_version == 3


def test_typed_events_are_written_and_read_back_as_the_same_types(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    with EventLog(path, clock=lambda: 5.0, wall_clock=lambda: 1_700_000_000.0) as log:
        log.emit(TaskIssued(client_id="a", task_id="t1", model_version=0))
        log.emit(UpdateAccepted(client_id="a", task_id="t1", staleness=0, bytes_up=10,
                                train_seconds=1.5))
        log.emit(Flush.build(model_version=1, num_updates=1, accuracy=0.5, halvings=2))
    issued, accepted, flush = read_events(path)
    assert isinstance(issued, TaskIssued) and issued.task_id == "t1"
    assert issued.t == 1_700_000_000.0 and issued.elapsed == 0.0
    assert isinstance(accepted, UpdateAccepted) and accepted.train_seconds == 1.5
    assert isinstance(flush, Flush) and flush.accuracy == 0.5
    assert flush.extra == {"halvings": 2} and flush["halvings"] == 2
    # On disk, the same JSON objects as before: unset fields are left out.
    first = json.loads(path.read_text().splitlines()[1])
    assert first == {"t": 1_700_000_000.0, "elapsed": 0.0, "kind": "update_accepted",
                     "client_id": "a", "task_id": "t1", "staleness": 0, "bytes_up": 10,
                     "train_seconds": 1.5}


def test_a_file_from_an_earlier_version_still_reads(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    lines = [{"t": 1.0, "elapsed": 0.0, "kind": "task_issued", "client_id": "a",
              "task_id": "t1", "model_version": 0, "since_removed": True},
             {"t": 2.0, "elapsed": 1.0, "kind": "a_kind_of_the_future", "x": 1}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    issued, other = read_events(path)
    assert isinstance(issued, TaskIssued) and issued.extra == {"since_removed": True}
    assert issued == lines[0]  # still reads like the JSON object it is
    assert isinstance(other, OtherEvent) and other.kind == "a_kind_of_the_future"
    assert other["x"] == 1 and dict(other) == lines[1]


def test_subscribers_get_typed_events_of_their_kind_once_written() -> None:
    log = EventLog(None)
    flushes: list[Flush] = []
    issued: list[object] = []
    everything: list[str] = []
    log.on_flush(flushes.append)
    log.subscribe("task_issued", issued.append)
    stop = log.subscribe(lambda e: everything.append(e.kind))
    with log.captured() as held:
        log.emit("flush", model_version=1, num_updates=2)
        assert flushes == []  # captured: not written yet
    log.write_captured(held)
    log.emit("task_issued", client_id="a", task_id="t1", model_version=1)
    stop()
    log.emit("flush", model_version=2, num_updates=1)
    assert [f.model_version for f in flushes] == [1, 2]
    assert all(isinstance(f, Flush) for f in flushes)
    assert [type(e) for e in issued] == [TaskIssued]
    assert everything == ["flush", "task_issued"]
    with pytest.raises(ValueError, match="unknown event kind"):
        log.subscribe("flsh", print)


def test_the_log_keeps_counts_and_reads_events_back_from_its_file(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text(json.dumps({"t": 0.0, "elapsed": 0.0, "kind": "run_started"}) + "\n")
    with EventLog(path) as log:  # appending to an earlier process's log
        for n in range(3):
            log.emit(TaskIssued(client_id="a", task_id=f"t{n}", model_version=0))
        log.emit(ClientNetwork(index=0, profile="3g", link={"bytes": 5}))
        assert log.count() == 4 and log.count(TaskIssued) == 3 and len(log) == 4
        assert [e.task_id for e in log.of_kind(TaskIssued)] == ["t0", "t1", "t2"]
        assert [e.kind for e in log.events] == ["task_issued"] * 3 + ["client_network"]
    assert log.of_kind("client_network")[0]["link"] == {"bytes": 5}  # readable after close
    assert len(read_events(path)) == 5


def test_an_anonymous_log_streams_to_a_file_it_can_read_back() -> None:
    log = EventLog(None)
    log.emit("client_joined", client_id="a", name="phone", num_examples=3)
    log.close()
    (joined,) = log.of_kind("client_joined")
    assert joined.name == "phone" and from_record(dict(joined)) == joined


class Bar:
    def __init__(self) -> None:
        self.shown: list[tuple[int, float | None, int, int]] = []

    def update(self, round: int, accuracy: float | None, bytes_up: int,
               bytes_down: int) -> None:
        self.shown.append((round, accuracy, bytes_up, bytes_down))


def test_the_flush_watch_moves_the_bar_and_tells_the_first_flush_at_the_target() -> None:
    log, bar = EventLog(None), Bar()
    told: list[int | None] = []
    watch = FlushWatch(bar, 0.8, lambda f: told.append(f.model_version))
    log.on_flush(watch)
    for version, accuracy in enumerate([0.5, 0.85, 0.9], start=1):
        log.emit(Flush(model_version=version, accuracy=accuracy, bytes_up=10, bytes_down=20))
    assert told == [2]  # once, on the flush that reached the target
    assert watch.reached is not None and watch.reached.model_version == 2
    assert bar.shown == [(1, 0.5, 10, 20), (2, 0.85, 20, 40), (3, 0.9, 30, 60)]


def test_build_refuses_undeclared_and_reserved_fields_and_equals_the_checked_path() -> None:
    fields = {"client_id": "a", "task_id": "t1", "base_version": 2, "weight": 3.0}
    built = UpdateAccepted.build(**fields)
    assert built.body() == make_event("update_accepted", fields).body() == fields
    with pytest.raises(ValueError, match="has no field"):
        UpdateAccepted.build(client_id="a", accuracy=0.5)
    with pytest.raises(ValueError, match="reserved event field"):
        UpdateAccepted.build(client_id="a", t=1.0)
