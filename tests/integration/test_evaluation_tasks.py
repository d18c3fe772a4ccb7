"""Evaluation tasks over real gRPC on loopback: ``[coordinator.evaluation]`` sends them to
clients that can evaluate (whether they train this version or not), never to one that did not
advertise the capability; reports are weighted by examples and a replayed one counts once."""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest
from conftest import CoordinatorFactory, TowardTrainer, gather_bounded, run_async, target_of

from fedlink.client import ClientOptions, ClientSession, RetryPolicy
from fedlink.coordinator import CoordinatorConfig, FlushRule
from fedlink.coordinator.config import EvaluationConfig
from fedlink.messages import EVALUATE_CAPABILITY
from fedlink.metrics.federated import federated_figures
from fedlink.proto.v1 import coordinator_pb2 as pb
from fedlink.proto.v1 import coordinator_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(90)

DIM = 16
X0 = np.zeros(DIM, np.float32)
FAST_RETRY = RetryPolicy(initial_backoff_s=0.01, max_backoff_s=0.05, max_attempts=5)


class ScoringTrainer(TowardTrainer):
    """A ``TowardTrainer`` that can evaluate: a fixed accuracy, the distance as its loss."""

    def __init__(self, target: np.ndarray, examples: int, accuracy: float) -> None:
        super().__init__(target, examples=examples)
        self.accuracy = accuracy
        self.scored: list[np.ndarray] = []

    def evaluate(self, params: np.ndarray) -> dict[str, float]:
        """The model's scores on this client's "data"."""
        self.scored.append(params.copy())
        return {"loss": float(np.linalg.norm(params - self.target)),
                "accuracy": self.accuracy, "examples": float(self.examples)}


def config(rounds: int, goal: int) -> CoordinatorConfig:
    return CoordinatorConfig(rounds=rounds, flush=FlushRule(goal=goal, deadline_s=None),
                             evaluation=EvaluationConfig(fraction=1.0, every=1))


def test_clients_outside_the_cohort_evaluate_and_the_curve_is_example_weighted(
        coordinator: CoordinatorFactory) -> None:
    rounds, goal = 3, 2
    rng = np.random.default_rng(5)
    scoring = [ScoringTrainer(rng.normal(size=DIM).astype(np.float32), n, a)
               for n, a in ((10, 0.9), (20, 0.1), (30, 0.6), (40, 0.3))]
    plain = TowardTrainer(rng.normal(size=DIM).astype(np.float32), examples=25)  # no evaluate

    async def main() -> tuple[list[ClientSession], list[dict[str, object]]]:
        async with coordinator(config(rounds, goal), X0) as server:
            sessions = [ClientSession(target_of(server), t,
                                      ClientOptions(name=f"dev{i}", retry=FAST_RETRY))
                        for i, t in enumerate([*scoring, plain])]
            await gather_bounded(*(s.run() for s in sessions), timeout=60)
            await asyncio.wait_for(server.wait_finished(), 10)
            return sessions, [dict(e) for e in server.events.events]

    sessions, events = run_async(main(), timeout=80)
    ids = [s.client_id for s in sessions]
    examples_of = {ids[i]: t.examples for i, t in enumerate(scoring)}
    reported = [e for e in events if e["kind"] == "evaluation_reported"]
    trained = {(e["client_id"], e["model_version"]) for e in events if e["kind"] == "task_issued"}
    # clients evaluated versions they were not chosen to train on (cohort 2 of 5)
    assert any((e["client_id"], e["model_version"]) not in trained for e in reported)
    # the client whose trainer cannot evaluate never advertised it, and was never asked
    assert ids[-1] not in {e["client_id"] for e in events if e["kind"] == "evaluation_issued"}
    assert sessions[-1].stats.evaluations == 0 and sessions[-1].stats.tasks > 0
    assert sum(s.stats.evaluations for s in sessions) == len(reported)
    # evaluations carry no update and do not count toward a flush
    assert [e["num_updates"] for e in events if e["kind"] == "flush"] == [goal] * rounds
    assert sum(1 for e in events if e["kind"] == "update_accepted") == goal * rounds
    # every report is weighted by the examples its client scored
    assert all(e["num_examples"] == examples_of[str(e["client_id"])] for e in reported)
    curve = federated_figures(events)["federated_evaluation"]  # type: ignore[arg-type]
    weighted_differs = False
    for version, accuracy in zip(curve["versions"], curve["accuracy"], strict=True):
        rows = [e for e in reported if e["model_version"] == version]
        weights = np.array([r["num_examples"] for r in rows], dtype=float)
        accuracies = np.array([r["accuracy"] for r in rows])
        assert accuracy == pytest.approx(float(weights @ accuracies / weights.sum()))
        weighted_differs |= accuracy != pytest.approx(float(accuracies.mean()))
    assert weighted_differs
    assert sorted(curve["last_client_accuracies"]) == curve["last_client_accuracies"]
    issued = [e for e in events if e["kind"] == "evaluation_issued"]
    assert curve["issued"] == [sum(1 for e in issued if e["model_version"] == version)
                               for version in curve["versions"]]
    assert all(n >= reports for n, reports in zip(curve["issued"], curve["clients"],
                                                  strict=True))
    # each client scored the global model of the version it was asked about
    for trainer in scoring:
        assert trainer.scored and all(p.shape == (DIM,) for p in trainer.scored)


async def raw_join(stub: pb_grpc.CoordinatorStub, name: str, examples: int,
                   capabilities: tuple[str, ...] = ()) -> str:
    reply = await stub.Join(pb.JoinRequest(client_name=name, num_examples=examples,
                                           capabilities=list(capabilities)), timeout=5)
    return str(reply.client_id)


async def get_task(stub: pb_grpc.CoordinatorStub, client_id: str) -> pb.GetTaskReply:
    return await stub.GetTask(pb.GetTaskRequest(client_id=client_id, held_version=-1),
                              timeout=15)


def test_raw_protocol_old_client_never_evaluates_and_a_replayed_report_counts_once(
        coordinator: CoordinatorFactory) -> None:
    async def main() -> list[dict[str, object]]:
        async with coordinator(config(rounds=1, goal=2), X0) as server:
            async with grpc.aio.insecure_channel(target_of(server)) as channel:
                stub = pb_grpc.CoordinatorStub(channel)
                old = await raw_join(stub, "old", 10)  # a 0.2 client: no capabilities
                new = await raw_join(stub, "new", 7, (EVALUATE_CAPABILITY,))
                third = await raw_join(stub, "third", 9, (EVALUATE_CAPABILITY,))
                old_task = (await get_task(stub, old)).task
                assert old_task.kind == pb.TASK_KIND_TRAIN and old_task.task_id.startswith("t")
                evaluation = (await get_task(stub, new)).task
                assert evaluation.kind == pb.TASK_KIND_EVALUATE
                assert (await get_task(stub, new)).task.task_id == evaluation.task_id  # open: again
                beat = await stub.Heartbeat(pb.HeartbeatRequest(
                    client_id=new, task_id=evaluation.task_id), timeout=5)
                assert beat.task_open
                data = evaluation.model_data or b"".join([c.data async for c in stub.Download(
                    pb.DownloadRequest(client_id=new, task_id=evaluation.task_id),
                    timeout=5)])
                assert np.array_equal(np.frombuffer(data, "<f4"), X0)
                report = pb.EvaluationReport(client_id=new, task_id=evaluation.task_id,
                                             model_version=0, num_examples=10**9,
                                             metrics={"loss": 0.25, "accuracy": 0.5})
                first = await stub.ReportEvaluation(report, timeout=5)
                replayed = await stub.ReportEvaluation(report, timeout=5)
                assert (first.duplicate, replayed.duplicate) == (False, True)
                # the evaluation took no place: "new" now gets the cohort's second one
                second = (await get_task(stub, new)).task
                assert second.kind == pb.TASK_KIND_TRAIN
                # bounded by the same validation as a commit's metrics
                bad_task = (await get_task(stub, third)).task
                assert bad_task.kind == pb.TASK_KIND_EVALUATE
                with pytest.raises(grpc.aio.AioRpcError) as bad:
                    await stub.ReportEvaluation(pb.EvaluationReport(
                        client_id=third, task_id=bad_task.task_id, model_version=0,
                        num_examples=3, metrics={f"m{i}": 1.0 for i in range(1000)}),
                        timeout=5)
                assert bad.value.code() is grpc.StatusCode.INVALID_ARGUMENT
                assert (await get_task(stub, old)).task.task_id == old_task.task_id  # only training
            return [dict(e) for e in server.events.events]

    events = run_async(main(), timeout=60)
    reported = [e for e in events if e["kind"] == "evaluation_reported"]
    assert len(reported) == 1
    assert (reported[0]["num_examples"], reported[0]["accuracy"]) == (7, 0.5)  # bounded
    issued = [e for e in events if e["kind"] == "evaluation_issued"]
    assert {e["client_id"] for e in issued} == {e["client_id"] for e in events
                                                  if e["kind"] == "client_joined"
                                                  and e["name"] != "old"}


def test_a_client_that_just_evaluated_v0_gets_its_training_task_with_no_payload(
        coordinator: CoordinatorFactory) -> None:
    """It holds v0: no v0-to-v0 delta, no inline model (protocol 1.1, section 7)."""
    async def main() -> pb.Task:
        async with coordinator(config(rounds=1, goal=2), X0) as server, \
                grpc.aio.insecure_channel(target_of(server)) as channel:
            stub = pb_grpc.CoordinatorStub(channel)
            client = await raw_join(stub, "evaluator", 5, (EVALUATE_CAPABILITY,))
            evaluation = (await get_task(stub, client)).task
            assert evaluation.kind == pb.TASK_KIND_EVALUATE
            await stub.ReportEvaluation(pb.EvaluationReport(
                client_id=client, task_id=evaluation.task_id, model_version=0,
                num_examples=5, metrics={"loss": 1.0, "accuracy": 0.5}), timeout=5)
            reply = await stub.GetTask(pb.GetTaskRequest(client_id=client, held_version=0),
                                       timeout=15)
            return reply.task

    task = run_async(main(), timeout=60)
    assert task.kind == pb.TASK_KIND_TRAIN and task.model_version == 0
    assert task.delta_base_version == -1 and not task.delta.encoding
    assert not task.delta_data and not task.model_data
