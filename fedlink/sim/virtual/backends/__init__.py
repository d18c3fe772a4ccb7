"""Training backends of virtual mode: where selected clients train (``[run] backend``).

- ``inline``: in the loop's process (what ``[virtual] workers = 0`` always means);
- ``processes`` (the default): ``workers`` spawned processes on this machine
  (``fedlink.sim.virtual.backends.processes``);
- ``ray``: ``workers`` Ray actors, on a local Ray started on loopback or on ``[ray] address``
  (``fedlink.sim.virtual.backends.ray_actors``; the ``ray`` extra, imported only then).

Each is a factory ``(BackendContext) -> TrainingBackend`` in ``BACKENDS``; an import string
``"package.module:attr"`` names your own.
"""

from __future__ import annotations

from fedlink.sim.virtual.backends.base import (
    BACKENDS,
    BackendContext,
    ClientJob,
    ClientUpload,
    ConfigPopulation,
    TrainingBackend,
    TrainingTask,
    TrainingWorkerError,
    do_job,
)
from fedlink.sim.virtual.backends.inline import InlineTraining

__all__ = ["BACKENDS", "BackendContext", "ClientJob", "ClientUpload", "ConfigPopulation",
           "InlineTraining", "TrainingBackend", "TrainingTask", "TrainingWorkerError", "do_job",
           "training_backend"]


@BACKENDS.register("inline")
def _inline(context: BackendContext) -> TrainingBackend:
    return InlineTraining.started(context)


@BACKENDS.register("processes")
def _processes(context: BackendContext) -> TrainingBackend:
    from fedlink.sim.virtual.backends.processes import ProcessTraining

    return ProcessTraining.started(context)


@BACKENDS.register("ray")
def _ray(context: BackendContext) -> TrainingBackend:
    from fedlink.sim.virtual.backends.ray_actors import RayTraining  # imports ray

    return RayTraining.started(context)


def training_backend(name: str, context: BackendContext) -> TrainingBackend:
    """The backend ``name`` names, started for ``context`` (inline when it has 0 workers)."""
    if context.workers == 0:
        return InlineTraining.started(context)
    return BACKENDS.get(name)(context)
