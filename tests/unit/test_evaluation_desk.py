"""Evaluation tasks on the coordinator (``fedlink.coordinator.evaluations``), with a fake clock:
who is asked, when, what a task is, how it expires, and a report counted once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import FakeClock, run_async

from fedlink.coordinator import CoordinatorConfig, FlushRule, LimitsConfig
from fedlink.coordinator.config import EvaluationConfig
from fedlink.coordinator.engine import RoundEngine
from fedlink.coordinator.evaluations import EvaluationDesk, chosen, evaluators
from fedlink.coordinator.records import ReceivedUpdate
from fedlink.coordinator.tasks import TaskState
from fedlink.errors import InvalidArgument, NotFound, PermissionDenied, UpdateRefused
from fedlink.messages import EVALUATE_CAPABILITY, EvaluationReport, Task, TaskKind
from fedlink.metrics import EventLog
from fedlink.refusals import RefusalCode

DIM = 4
DECLARED = {"ca": 30, "cb": 50, "old": 10}


def desk(clock: FakeClock, fraction: float = 1.0, every: int = 1,
         goal: int = 1) -> tuple[EvaluationDesk, RoundEngine, EventLog]:
    config = CoordinatorConfig(rounds=5, flush=FlushRule(goal=goal, deadline_s=None),
                               evaluation=EvaluationConfig(fraction=fraction, every=every),
                               limits=LimitsConfig(max_task_s=100.0), seed=3)
    events = EventLog(None)
    engine = RoundEngine(config, np.zeros(DIM, np.float32), events, clock=clock)
    evaluations = EvaluationDesk(config, engine, events, lambda c: f"name-{c}",
                                 lambda c: DECLARED.get(c, 0), clock)
    for client in ("ca", "cb"):
        evaluations.joined(client, (EVALUATE_CAPABILITY,))
    evaluations.joined("old", ())
    return evaluations, engine, events


def report(task: Task, client: str = "ca", examples: int = 20,
           **metrics: float) -> EvaluationReport:
    return EvaluationReport(client, task.task_id, task.model_version, examples,
                            metrics or {"loss": 0.5, "accuracy": 0.75})


def flush_once(engine: RoundEngine, client: str = "cb") -> None:
    task = engine.issue(client)
    assert isinstance(task, Task)
    engine.submit(ReceivedUpdate(client, task.task_id, task.model_version,
                                 np.ones(DIM, np.float32), 10, 1, 1, 16))


def test_a_seeded_fraction_of_clients_evaluates_every_nth_version() -> None:
    config = EvaluationConfig(fraction=0.3, every=2)
    names = [f"client-{n}" for n in range(400)]
    picked = {version: chosen(config, 7, names, version) for version in range(6)}
    assert not any(picked[v] for v in (1, 3, 5))
    assert [len(picked[v]) for v in (0, 2, 4)] == [120, 120, 120]  # the same count each time
    assert picked[0] != picked[2]  # ... not the same clients
    assert chosen(config, 7, reversed(names), 2) == picked[2]  # reproducible, order-free
    assert chosen(config, 8, names, 2) != picked[2]
    assert len(chosen(config, 7, names, 3, final=True)) == 120  # the final version always
    assert not chosen(EvaluationConfig(), 7, names, 2)  # off
    assert [evaluators(n, 0.5) for n in (0, 1, 3, 10)] == [0, 1, 2, 5]
    assert evaluators(7, 0.01) == 1  # at least one while on


def test_an_evaluation_task_goes_to_capable_clients_only_and_takes_no_place(
        fake_clock: FakeClock) -> None:
    evaluations, engine, events = desk(fake_clock)
    assert evaluations.offer("old", -1) is None  # never advertised the capability
    task = evaluations.offer("ca", -1)
    assert task is not None and task.kind is TaskKind.EVALUATE
    assert task.task_id.startswith("e") and (task.local_steps, task.local_epochs) == (0, 0)
    assert task.model == engine.payload(0).header and 0 < task.deadline_s <= 100.0
    assert evaluations.offer("ca", -1) == task  # asked again while open: the same task
    assert engine.free_places() == 1  # the cohort (goal 1) is untouched
    assert [e.kind for e in events.events] == ["evaluation_issued"]


def test_a_report_counts_once_weighted_by_bounded_examples(fake_clock: FakeClock) -> None:
    evaluations, engine, events = desk(fake_clock)
    task = evaluations.offer("ca", -1)
    assert task is not None
    first = evaluations.report(report(task, examples=10**9))
    again = evaluations.report(report(task, examples=5, loss=9.0))
    assert (first.duplicate, again.duplicate) == (False, True)
    (reported,) = events.of_kind("evaluation_reported")
    assert reported["num_examples"] == DECLARED["ca"]  # never more than it declared
    assert (reported["loss"], reported["accuracy"], reported["model_version"]) == (0.5, 0.75, 0)
    assert evaluations.offer("ca", 0) is None  # one evaluation per version
    flush_once(engine)
    assert evaluations.offer("ca", 0) is not None  # the next version is due


def test_every_n_versions_only(fake_clock: FakeClock) -> None:
    evaluations, engine, _ = desk(fake_clock, every=2)
    offered = []
    for _ in range(4):
        task = evaluations.offer("ca", -1)
        offered.append(None if task is None else task.model_version)
        if task is not None:
            evaluations.report(report(task))
        flush_once(engine)
    assert offered == [0, None, 2, None]


def test_bad_reports_are_refused_and_change_nothing(fake_clock: FakeClock) -> None:
    evaluations, _, events = desk(fake_clock)
    task = evaluations.offer("ca", -1)
    other = evaluations.offer("cb", -1)
    assert task is not None and other is not None
    with pytest.raises(InvalidArgument, match="non-finite"):
        evaluations.report(report(task, loss=float("nan")))
    with pytest.raises(InvalidArgument, match="accuracy"):
        evaluations.report(report(task, accuracy=1.5))
    with pytest.raises(InvalidArgument, match="num_examples"):
        evaluations.report(report(task, examples=0))
    with pytest.raises(InvalidArgument, match="model_version"):
        evaluations.report(EvaluationReport("ca", task.task_id, 3, 5, {"loss": 1.0}))
    with pytest.raises(PermissionDenied):
        evaluations.report(report(other, client="ca"))
    with pytest.raises(NotFound):
        evaluations.report(EvaluationReport("ca", "e99-v0", 0, 5, {}))
    assert events.of_kind("evaluation_reported") == []
    assert not evaluations.report(report(task)).duplicate  # still open: a good one counts


def test_a_client_that_cannot_score_declines_and_the_task_closes(fake_clock: FakeClock) -> None:
    """No example scored and no score (protocol 1.2): not handed back until it expires."""
    evaluations, _, events = desk(fake_clock)
    task = evaluations.offer("ca", -1)
    assert task is not None
    decline = EvaluationReport("ca", task.task_id, task.model_version, 0, {})
    assert decline.declines and not evaluations.report(decline).duplicate
    assert evaluations.report(decline).duplicate  # a retry whose answer was lost
    record, task_open = evaluations.lookup("ca", task.task_id)
    assert not task_open and record.state is TaskState.CLOSED
    assert evaluations.offer("ca", -1) is None  # nothing handed back for this version
    [declined] = events.of_kind("evaluation_declined")
    assert (declined["task_id"], declined["model_version"]) == (task.task_id, 0)
    assert events.of_kind("evaluation_reported") == []


def test_an_evaluation_task_expires_and_closes_when_its_client_leaves(
        fake_clock: FakeClock) -> None:
    evaluations, _, events = desk(fake_clock)
    task = evaluations.offer("ca", -1)
    left = evaluations.offer("cb", -1)
    assert task is not None and left is not None
    fake_clock.advance(101.0)  # past max_task_s
    record, task_open = evaluations.lookup("ca", task.task_id)
    assert not task_open and record.state is TaskState.CLOSED
    with pytest.raises(UpdateRefused) as refused:
        evaluations.report(report(task))
    assert refused.value.refusal is RefusalCode.TASK_CLOSED
    evaluations.forget_client("cb")
    with pytest.raises(NotFound):
        evaluations.report(report(left, client="cb"))
    assert events.of_kind("evaluation_reported") == []


def test_a_task_whose_model_is_gone_is_replaced(fake_clock: FakeClock) -> None:
    """Asked again (its download failed) after its model stopped being served."""
    evaluations, engine, _ = desk(fake_clock)
    first = evaluations.offer("ca", -1)
    flush_once(engine)  # version 1; max_staleness 0: version 0 is no longer served
    second = evaluations.offer("ca", -1)
    assert first is not None and second is not None
    assert (second.model_version, second.task_id != first.task_id) == (1, True)
    _, first_open = evaluations.lookup("ca", second.task_id)
    assert first_open


def test_what_a_client_can_do_survives_a_restart(tmp_path: Path) -> None:
    from fedlink.coordinator import CoordinatorService
    from fedlink.messages import GetTaskRequest, JoinRequest

    config = CoordinatorConfig(rounds=2, flush=FlushRule(goal=1, deadline_s=None),
                               evaluation=EvaluationConfig(fraction=1.0),
                               state_dir=str(tmp_path))

    def service() -> CoordinatorService:
        return CoordinatorService(config, np.zeros(DIM, np.float32), EventLog(None))

    first = service()
    capable = run_async(first.join(JoinRequest(
        "capable", num_examples=5, capabilities=(EVALUATE_CAPABILITY,),
        metadata={"\x00capabilities": "ignored"}))).client_id
    spoofing = run_async(first.join(JoinRequest(
        "spoofing", num_examples=5, metadata={"\x00capabilities": EVALUATE_CAPABILITY})))
    first.state.close()  # a crash: what is durable stays
    second = service()
    for client_id, kind in ((capable, TaskKind.EVALUATE), (spoofing.client_id, TaskKind.TRAIN)):
        reply = run_async(second.get_task(GetTaskRequest(client_id)))
        assert isinstance(reply, Task) and reply.kind is kind
    second.close()


def test_the_final_version_is_evaluated_even_when_every_skips_it(
        fake_clock: FakeClock) -> None:
    evaluations, engine, events = desk(fake_clock, every=2)
    changes: list[int] = []
    evaluations.on_final_change = lambda: changes.append(engine.version)
    for _ in range(5):  # versions 1..5: the run's rounds are done at 5, not a multiple of 2
        task = evaluations.offer("ca", -1)
        if task is not None:
            evaluations.report(report(task))
        flush_once(engine)
    assert engine.finished and engine.version == 5
    assert evaluations.final_pending()  # the run's end waits for version 5's reports
    final = [evaluations.offer(c, -1) for c in ("ca", "cb", "old")]
    assert [t.model_version for t in final if t is not None] == [5, 5]
    assert final[2] is None  # never advertised the capability
    evaluations.report(report(final[0], "ca"))  # type: ignore[arg-type]
    assert evaluations.final_pending() and changes == [5]
    evaluations.report(report(final[1], "cb"))  # type: ignore[arg-type]
    assert not evaluations.final_pending()
    versions = [e["model_version"] for e in events.of_kind("evaluation_reported")]
    assert versions[-2:] == [5, 5]


def test_the_final_evaluations_wait_for_a_client_that_left_or_time_out(
        fake_clock: FakeClock) -> None:
    evaluations, engine, _ = desk(fake_clock)
    for _ in range(5):
        flush_once(engine)
    assert evaluations.final_pending()
    evaluations.forget_client("cb")  # left without evaluating: not waited for
    assert evaluations.final_pending()  # "ca" still may
    fake_clock.advance(101.0)  # limits.max_task_s after the end: the run ends without it
    assert not evaluations.final_pending()
    assert evaluations.offer("ca", -1) is None


def test_a_run_restarted_after_its_end_does_not_wait(fake_clock: FakeClock) -> None:
    evaluations, engine, _ = desk(fake_clock)
    for _ in range(5):
        flush_once(engine)
    evaluations.final_evaluations = False
    assert not evaluations.final_pending()


def test_a_run_ended_early_evaluates_its_last_version_too(fake_clock: FakeClock) -> None:
    """Ended between due versions (a target accuracy, a signal) after clients already asked
    for that version's task: they are asked again for the final evaluation."""
    evaluations, engine, _ = desk(fake_clock, every=2)
    flush_once(engine)  # version 1: not due
    assert evaluations.offer("ca", -1) is None and evaluations.offer("cb", -1) is None
    engine.finish("reached the target accuracy")
    assert evaluations.final_pending()
    final = [evaluations.offer(c, -1) for c in ("ca", "cb")]
    assert [t.model_version for t in final if t is not None] == [1, 1]
    for client, task in zip(("ca", "cb"), final, strict=True):
        evaluations.report(report(task, client))  # type: ignore[arg-type]
    assert not evaluations.final_pending()
