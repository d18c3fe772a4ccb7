"""The client's lifecycle (``fedlink.client.protocol``) driven by scripted inputs, no I/O: what
a client does next after each thing it hears, as both the real session and the virtual loop
perform it."""

from __future__ import annotations

import pytest

from fedlink.client.protocol import (
    Accepted,
    CheckIn,
    ClientProtocol,
    Deliver,
    Download,
    Encode,
    Encoded,
    Evaluate,
    Lost,
    MaskedUpload,
    ModelReceived,
    Offered,
    PhaseDone,
    ProtocolError,
    ProtocolSettings,
    Refused,
    Report,
    Scored,
    Slept,
    Stop,
    Train,
    Trained,
    Unmask,
    WaitFor,
    outcome_of,
    plan_for,
)
from fedlink.errors import DataLoss, InvalidArgument, Unavailable, UpdateRefused
from fedlink.messages import Finished, Task, TaskKind, TensorHeader, Wait
from fedlink.refusals import RefusalCode

HEADER = TensorHeader("fp32", (4,), "float32", 16, "sha256:0")


def _task(task_id: str = "t1", version: int = 3, deadline_s: float = 0.0,
          kind: TaskKind = TaskKind.TRAIN) -> Task:
    return Task(task_id, version, 5, 1, deadline_s, HEADER, kind=kind)


def _through_training(protocol: ClientProtocol, task: Task, at: float = 0.0) -> Deliver:
    """Offer ``task`` and answer each action up to the delivery."""
    download = protocol.heard(Offered(task, at))
    assert isinstance(download, Download)
    train = protocol.heard(ModelReceived(task.model_version))
    assert isinstance(train, Train)
    assert isinstance(protocol.heard(Trained(at)), Encode)
    deliver = protocol.heard(Encoded(100))
    assert isinstance(deliver, Deliver)
    return deliver


def test_a_training_task_goes_from_check_in_to_delivery_and_back() -> None:
    protocol = ClientProtocol()
    assert protocol.start() == CheckIn(-1)
    task = _task()
    assert protocol.heard(Offered(task)) == Download(task, -1)
    assert protocol.heard(ModelReceived(3)) == Train(task, None)
    assert protocol.heard(Trained()) == Encode(task, None)
    assert protocol.heard(Encoded(100)) == Deliver(task, 100, inline=False)
    assert protocol.heard(Accepted()) == CheckIn(3)  # it says it holds version 3 now
    assert protocol.outcome == Accepted() and protocol.tasks == 1


def test_a_client_that_holds_the_tasks_version_downloads_nothing() -> None:
    protocol = ClientProtocol(held_version=3)
    protocol.start()
    assert protocol.heard(Offered(_task(version=3))) == Download(_task(version=3), 3)
    assert not Download(_task(version=3), 3).needed
    other = ClientProtocol(held_version=2)
    other.start()
    assert other.heard(Offered(_task(version=3))) == Download(_task(version=3), 2)
    assert Download(_task(version=3), 2).needed  # an older version: bytes (maybe a delta) come


def test_wait_then_ask_again_and_finished_stops() -> None:
    protocol = ClientProtocol()
    protocol.start()
    assert protocol.heard(Offered(Wait(7.5, "cohort full"))) == WaitFor(7.5)
    assert protocol.heard(Slept()) == CheckIn(-1)
    assert protocol.heard(Offered(Finished("rounds done"))) == Stop("rounds done", run_over=True)
    with pytest.raises(ProtocolError, match="while stopped"):
        protocol.heard(Offered(_task()))


def test_the_deadline_is_an_instant_on_the_drivers_clock() -> None:
    protocol = ClientProtocol()
    protocol.start()
    task = _task(deadline_s=10.0)
    protocol.heard(Offered(task, at=100.0))
    assert protocol.heard(ModelReceived(3)) == Train(task, 110.0)
    assert protocol.heard(Trained(at=104.0)) == Encode(task, 6.0)  # time left to size it


def test_small_updates_travel_inside_the_commit() -> None:
    for inline_bytes, num_bytes, inline in ((100, 100, True), (100, 101, False),
                                             (0, 10, False), (100, 0, False)):
        protocol = ClientProtocol(ProtocolSettings(inline_bytes=inline_bytes))
        protocol.start()
        protocol.heard(Offered(_task()))
        protocol.heard(ModelReceived(3))
        protocol.heard(Trained())
        assert protocol.heard(Encoded(num_bytes)) == Deliver(_task(), num_bytes, inline)


def test_a_refused_or_lost_task_ends_in_any_phase_and_the_client_checks_in() -> None:
    for phases in range(4):
        protocol = ClientProtocol(held_version=1)
        protocol.start()
        protocol.heard(Offered(_task(version=3)))
        script = [ModelReceived(3), Trained(), Encoded(10)][:phases]
        for event in script:
            protocol.heard(event)
        ending = Refused("too stale") if phases == 3 else Lost("checksum mismatch")
        held = 3 if phases else 1  # the model counts as held only once it was received
        assert protocol.heard(ending) == CheckIn(held)
        assert protocol.outcome == ending and protocol.task is None


def test_max_tasks_stops_after_that_many_training_tasks() -> None:
    assert ClientProtocol(ProtocolSettings(max_tasks=0)).start() == Stop(
        "did the 0 tasks asked for")
    protocol = ClientProtocol(ProtocolSettings(max_tasks=2))
    protocol.start()
    _through_training(protocol, _task("t1"))
    assert isinstance(protocol.heard(Accepted()), CheckIn)
    _through_training(protocol, _task("t2"))
    assert protocol.heard(Refused("round full")) == Stop("did the 2 tasks asked for",
                                                         run_over=False)


def test_an_evaluation_task_scores_and_reports_without_training() -> None:
    protocol = ClientProtocol(ProtocolSettings(max_tasks=1))
    protocol.start()
    task = _task("e1-v3", kind=TaskKind.EVALUATE)
    assert protocol.heard(Offered(task)) == Download(task, -1)
    assert protocol.heard(ModelReceived(3)) == Evaluate(task)
    assert protocol.heard(Scored()) == Report(task)  # a report, or its decline
    assert protocol.heard(Accepted()) == CheckIn(3)  # evaluations do not count as tasks


def test_a_client_without_an_evaluator_declines_and_waits() -> None:
    protocol = ClientProtocol(ProtocolSettings(can_evaluate=False, decline_wait_s=3.0))
    protocol.start()
    task = _task("e1-v3", kind=TaskKind.EVALUATE)
    assert protocol.heard(Offered(task)) == WaitFor(3.0, declined=task)
    assert protocol.heard(Slept()) == CheckIn(-1)


def test_what_cannot_happen_now_is_refused() -> None:
    protocol = ClientProtocol()
    protocol.start()
    with pytest.raises(ProtocolError, match="Trained heard while checking_in"):
        protocol.heard(Trained())
    with pytest.raises(ProtocolError, match="Lost heard while checking_in"):
        protocol.heard(Lost("no task to lose"))
    protocol.heard(Offered(_task(version=3)))
    with pytest.raises(ProtocolError, match="model version 2 received for a task of version 3"):
        protocol.heard(ModelReceived(2))
    with pytest.raises(ProtocolError, match="Accepted heard while downloading"):
        protocol.heard(Accepted())


def test_errors_end_a_task_as_refused_or_lost_or_stop_the_client() -> None:
    assert outcome_of(UpdateRefused("too stale", RefusalCode.TOO_STALE)) == Refused("too stale")
    assert isinstance(outcome_of(DataLoss("checksum mismatch")), Lost)
    assert outcome_of(Unavailable("down")) is None  # retries outlasted: not this task's fault
    assert outcome_of(InvalidArgument("bad request")) is None


def test_a_plan_carries_the_tasks_work_and_the_runs_settings() -> None:
    plan = plan_for(_task(version=7), 16, 0.1, {"mu": "0.01"}, seed=42, deadline=9.0)
    assert (plan.local_steps, plan.local_epochs, plan.batch_size, plan.learning_rate) == (
        5, 1, 16, 0.1)
    assert (plan.seed, plan.deadline, plan.model_version, dict(plan.options)) == (
        42, 9.0, 7, {"mu": "0.01"})


def test_a_secure_task_exchanges_keys_with_its_download_and_masks_once_encoded() -> None:
    protocol = ClientProtocol(ProtocolSettings(secure=True))
    protocol.start()
    task = _task()
    # the key exchange needs no update: it starts with the download, beside the training
    assert protocol.heard(Offered(task)) == Download(task, -1, exchange_keys=True)
    protocol.heard(ModelReceived(3))
    protocol.heard(Trained())
    assert protocol.heard(Encoded(100)) == MaskedUpload(task)
    assert protocol.heard(PhaseDone()) == Unmask(task)
    with pytest.raises(ProtocolError):  # the last phase ends with the answer, not another
        protocol.heard(PhaseDone())
    assert protocol.heard(Accepted()) == CheckIn(3)
    # a client dropped from its group (or refused in its key exchange) checks in again
    protocol.heard(Offered(_task("t2")))
    protocol.heard(ModelReceived(3))
    protocol.heard(Trained())
    protocol.heard(Encoded(100))
    assert protocol.heard(Refused("group lost")) == CheckIn(3)
    assert protocol.outcome == Refused("group lost")
    # an evaluation task of a secure run has no update, so no keys
    evaluation = _task("e1-v3", kind=TaskKind.EVALUATE)
    assert protocol.heard(Offered(evaluation)) == Download(evaluation, 3)
