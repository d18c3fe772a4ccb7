"""Training backends of virtual mode (``fedlink.sim.virtual.backends``): chosen by
``[run] backend``, tasks handed out earliest due first, a client's whole job (training and
update pipeline) done in the worker with the same result as in the loop's process, and Ray
started on loopback and shut down when the backend cannot start (a stand-in ``ray`` module
records what it is asked)."""

from __future__ import annotations

import functools
import os
import sys
import types
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedlink.client import TrainPlan
from fedlink.client.pipeline import UpdatePipeline
from fedlink.errors import ConfigError
from fedlink.experiment.config import ExperimentConfig
from fedlink.sim.virtual.backends import (
    BACKENDS,
    BackendContext,
    ClientJob,
    ClientUpload,
    InlineTraining,
    TrainingTask,
    TrainingWorkerError,
    do_job,
    training_backend,
)
from fedlink.sim.virtual.backends.schedule import Scheduler
from fedlink.sim.virtual.population import Links, SyntheticPopulation, SyntheticSpec
from fedlink.sim.virtual.runner import run_virtual


def _population() -> SyntheticPopulation:
    return SyntheticPopulation(SyntheticSpec(4, 3, seed=1), 10, Links(None, 10))


def _job(index: int, plan: TrainPlan | None = None) -> ClientJob:
    return ClientJob(index, plan or TrainPlan(), np.random.default_rng(index))


def _task(index: int, due: float) -> TrainingTask:
    return TrainingTask(_job(index), 0, np.zeros(15, np.float32), due=due)


def _same_upload(got: ClientUpload, expected: ClientUpload) -> None:
    """The same bytes, report, generator state and residual."""
    assert got.payload == expected.payload
    assert dict(got.privacy) == dict(expected.privacy)
    assert (got.num_examples, got.steps_completed) == (expected.num_examples,
                                                       expected.steps_completed)
    assert got.rng.bit_generator.state == expected.rng.bit_generator.state
    if expected.residual is None:
        assert got.residual is None
    else:
        np.testing.assert_array_equal(got.residual, expected.residual)


def test_a_bad_backend_name_fails_where_the_virtual_run_starts_naming_the_key(
        tmp_path: Path) -> None:
    config = ExperimentConfig.from_dict({"run": {"mode": "virtual", "backend": "nope"},
                                         "virtual": {"workers": 1}})  # 0: no backend runs
    with pytest.raises(ConfigError, match=r"run\.backend.*processes.*'nope'"):
        run_virtual(config, output_dir=tmp_path, progress=False)
    assert not (tmp_path / config.run.name).exists()  # refused before the run folder is made


def test_the_built_in_backends_are_registered_by_name() -> None:
    assert {"inline", "processes", "ray"} <= set(BACKENDS.names())
    assert ExperimentConfig().run.backend == "processes"


@pytest.mark.parametrize("name", ["processes", "ray"])
def test_zero_workers_trains_inline_whatever_the_backend(name: str) -> None:
    population = _population()
    backend = training_backend(name, BackendContext(0, population, _population))
    assert isinstance(backend, InlineTraining)
    task = _task(3, 0.0)
    result = backend.submit(task).result()
    _same_upload(result, do_job(_population(), UpdatePipeline, _job(3), task.model))


def test_a_free_worker_gets_the_earliest_due_task_not_the_first_submitted() -> None:
    started: list[tuple[str, int]] = []
    scheduler: Scheduler[str] = Scheduler(
        ["w"], lambda w, task, f: started.append((w, task.job.index)), depth=1)
    first = scheduler.submit(_task(1, due=9.0))  # starts at once: the worker was free
    scheduler.submit(_task(2, due=5.0))
    scheduler.submit(_task(3, due=1.0))
    assert started == [("w", 1)]
    scheduler.free("w")
    assert started[-1] == ("w", 3)
    scheduler.free("w")
    assert started[-1] == ("w", 2)
    assert first.running()


def test_workers_hold_a_next_task_but_the_last_one_waits_for_the_first_worker_free() -> None:
    """Each worker holds its next task while there are enough for all; a burst's last task
    is not queued behind a worker that has just started one while another may finish first:
    it goes to whichever worker frees up first."""
    started: list[tuple[str, int]] = []
    scheduler: Scheduler[str] = Scheduler(
        ["a", "b"], lambda w, task, f: started.append((w, task.job.index)))
    for index in range(4):
        scheduler.submit(_task(index, due=float(index)))
    assert started == [("a", 0), ("b", 1), ("a", 2), ("b", 3)]  # one running, one held each
    scheduler.free("a")  # a trains 2, b trains 1 and holds 3: only a has room
    scheduler.submit(_task(4, due=4.0))
    assert started[-1] == ("a", 4)
    scheduler.free("b")  # b trains 3; a trains 2 and holds 4
    scheduler.free("a")  # a trains 4: each trains one, and both have room
    scheduler.submit(_task(5, due=5.0))
    assert started[-1] == ("a", 4)  # one task for two workers with room: it waits
    scheduler.free("b")  # b is idle first: it takes task 5 at once
    assert started[-1] == ("b", 5)


def test_closing_cancels_the_tasks_still_waiting() -> None:
    scheduler: Scheduler[str] = Scheduler(["w"], lambda w, task, f: None, depth=1)
    scheduler.submit(_task(1, due=0.0))
    waiting = scheduler.submit(_task(2, due=1.0))
    scheduler.close()
    assert waiting.cancelled()


def test_a_worker_that_cannot_build_its_population_fails_the_start() -> None:
    from fedlink.sim.virtual.backends.processes import ProcessTraining

    broken = functools.partial(int, "not a population")  # picklable; raises in the worker
    with pytest.raises(TrainingWorkerError, match="could not start"):
        ProcessTraining(1, broken)  # type: ignore[arg-type]


class _FakeRay(types.ModuleType):
    """Records ``init``/``shutdown``; its actors never become ready."""

    class exceptions:  # mirrors ray.exceptions
        class RayError(Exception):
            pass

        class RayTaskError(RayError):
            pass

    def __init__(self) -> None:
        super().__init__("ray")
        self.inits: list[dict[str, Any]] = []
        self.shutdowns = 0
        self.up = False
        self.util = types.SimpleNamespace(get_node_ip_address=lambda: "127.0.0.1")

    def is_initialized(self) -> bool:
        return self.up

    def init(self, **options: Any) -> None:
        self.inits.append(options)
        self.up = True

    def shutdown(self) -> None:
        self.shutdowns += 1
        self.up = False

    def remote(self, **options: Any) -> Any:
        ready = types.SimpleNamespace(remote=lambda: Future())
        handle = types.SimpleNamespace(ready=ready)
        return lambda cls: types.SimpleNamespace(remote=lambda build, pipeline: handle)

    def get(self, refs: Any, timeout: float) -> None:
        raise self.exceptions.RayError("the actor died while building its population")

    def kill(self, actor: Any) -> None:
        pass


def test_ray_starts_on_loopback_and_is_shut_down_when_actors_cannot_start(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from fedlink.sim.virtual.backends.ray_actors import RayTraining

    fake = _FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.delenv("RAY_USAGE_STATS_ENABLED", raising=False)
    monkeypatch.delenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", raising=False)
    with pytest.raises(TrainingWorkerError, match=r"could not start.*building its population"):
        RayTraining(2, _population)
    options = fake.inits[0]
    assert options["_node_ip_address"] == "127.0.0.1"
    assert options["address"] == "local" and options["num_cpus"] == 2
    assert options["include_dashboard"] is False and options["log_to_driver"] is False
    assert os.environ["RAY_USAGE_STATS_ENABLED"] == "0"
    assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"  # Ray's loopback-only mode
    assert fake.shutdowns == 1 and not fake.up


def test_a_ray_already_running_is_used_and_left_running(monkeypatch: pytest.MonkeyPatch) -> None:
    from fedlink.sim.virtual.backends.ray_actors import RayTraining

    fake = _FakeRay()
    fake.up = True
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    with pytest.raises(TrainingWorkerError):
        RayTraining(2, _population)
    assert fake.inits == [] and fake.shutdowns == 0 and fake.up



def test_worker_processes_train_each_task_from_its_own_versions_model() -> None:
    from fedlink.sim.virtual.backends.processes import ProcessTraining

    spec = SyntheticSpec(4, 3, seed=1)
    build = functools.partial(SyntheticPopulation, spec, 10, Links(None, 10))  # picklable
    models = [np.full(15, float(v), np.float32) for v in range(3)]
    # versions interleaved, so a worker holding one version is sent a task of another
    tasks = [TrainingTask(_job(i, TrainPlan(local_steps=3, seed=i)), i % 3, models[i % 3], due=i)
             for i in range(8)]
    inline = build()
    pool = ProcessTraining(2, build)
    try:
        results = [future.result(timeout=60) for future in [pool.submit(t) for t in tasks]]
        assert pool.processes == 2
    finally:
        pool.close()
    for task, result in zip(tasks, results, strict=True):
        job = _job(task.job.index, task.job.plan)
        _same_upload(result, do_job(inline, UpdatePipeline, job, task.model))


def _private_sparse_pipeline() -> UpdatePipeline:
    """Clipping with noise, then top-k with error feedback: every stage with state or
    randomness that a worker must carry as the loop's process would."""
    return UpdatePipeline.from_names(
        "dp_fedavg", "topk", {"density": 0.3},
        privacy_options={"clip_norm": 0.5, "noise": "clients", "noise_multiplier": 0.8})


def test_a_worker_runs_the_clients_pipeline_with_its_generator_and_residual() -> None:
    """Noise and compression happen in the worker, from the client's own generator and
    residual, and give the upload, generator state and residual the loop's process would."""
    from fedlink.sim.virtual.backends.processes import ProcessTraining

    spec = SyntheticSpec(4, 3, seed=1)
    build = functools.partial(SyntheticPopulation, spec, 10, Links(None, 10))
    model = np.linspace(-1, 1, 15, dtype=np.float32)
    plan = TrainPlan(local_steps=3, seed=5)
    residual = np.full(15, 0.01, np.float32)
    inline = do_job(build(), _private_sparse_pipeline,
                    ClientJob(4, plan, np.random.default_rng(9), {}, residual.copy()), model)
    pool = ProcessTraining(1, build, _private_sparse_pipeline)
    try:
        job = ClientJob(4, plan, np.random.default_rng(9), {}, residual.copy())
        upload = pool.submit(TrainingTask(job, 0, model)).result(timeout=60)
    finally:
        pool.close()
    _same_upload(upload, inline)
    assert upload.payload.header.encoding == "topk"
    assert upload.residual is not None and not np.array_equal(upload.residual, residual)
    assert upload.rng.bit_generator.state != np.random.default_rng(9).bit_generator.state
