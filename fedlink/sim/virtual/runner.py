"""``[run] mode = "virtual"``: ``fedlink simulate`` on the discrete-event loop.

Writes the usual run folder (``events.jsonl``, ``summary.json``, ``report.md``, the final model)
and prints one progress line per flush in model time. Each event's ``elapsed`` is model
seconds (the event log runs on the virtual clock); ``flush`` events also carry
``model_seconds``, and the summary holds ``model_seconds``, ``simulation_seconds`` (wall) and
the communication/compute shares per round and per link profile (``time_by_round``,
``time_by_profile``: see ``fedlink.metrics.model_time``). With ``[run] tensorboard`` the run
folder holds TensorBoard scalars too, timed in model seconds from the run's start.
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedlink.clock import ManualClock
from fedlink.coordinator.engine import FlushOutcome
from fedlink.errors import ConfigError
from fedlink.experiment.run_folder import VECTOR_FILENAME, prepare_run_dir
from fedlink.metrics import (
    EVENTS_FILENAME,
    SUMMARY_FILENAME,
    EventLog,
    summarize,
    write_report,
    write_summary,
)
from fedlink.metrics.federated import federated_figures
from fedlink.metrics.model_time import time_shares
from fedlink.privacy.setup import with_run_seed
from fedlink.sim.virtual.availability import TraceAvailability, build_availability
from fedlink.sim.virtual.backends import (
    BACKENDS,
    BackendContext,
    ConfigPopulation,
    training_backend,
)
from fedlink.sim.virtual.loop import Evaluate, LoopOptions, LoopTotals, VirtualLoop
from fedlink.sim.virtual.population import (
    ExperimentPopulation,
    Links,
    Population,
    SyntheticPopulation,
    SyntheticSpec,
    TracedSpeeds,
)
from fedlink.sim.virtual.residuals import ResidualStore

if TYPE_CHECKING:
    from fedlink.client import Trainer
    from fedlink.experiment.config import ExperimentConfig
    from fedlink.experiment.setup import Experiment, Plugs
    from fedlink.sim.runner import SimulationResult



def run_virtual(config: ExperimentConfig, output_dir: Path | None = None,
                progress: bool = True, plugs: Plugs | None = None, *,
                report: bool = True) -> SimulationResult:
    """Run ``config`` on the virtual clock to the end; write and return its results.

    ``report=False`` skips ``report.md`` and its plots (see ``run_simulation``).

    ``plugs`` (objects in place of what the config names) need ``[virtual] workers = 0``:
    worker processes rebuild the experiment from the config alone.
    """
    from fedlink.sim.runner import (
        SimulationResult,
        recorded_config,
        refuse_rounds_the_fleet_cannot_fill,
    )

    started = time.perf_counter()
    check_backend(config)
    if config.partial_work.enabled:  # it wraps real trainers; the virtual clock times steps
        raise ConfigError("partial_work.fraction: applies to [run] mode = 'grpc' runs only; in "
                          "virtual mode every task's steps are charged in full (the fleet's "
                          "[network] speed makes stragglers there): remove [partial_work]")
    _check_plugs(config, plugs)
    population, initial, evaluate, experiment = _build(config, plugs)
    refuse_rounds_the_fleet_cannot_fill(
        config.coordinator.flush, population.size,
        "[virtual] population" if config.virtual.population else "[data] clients")
    run_dir = prepare_run_dir(config, output_dir)
    clock = ManualClock()
    availability = build_availability(config.virtual, config.run.seed)
    traced = population
    if isinstance(availability, TraceAvailability) and availability.speeds:
        traced = TracedSpeeds(population, availability.speeds)
    residuals = ResidualStore(config.virtual.residual_memory_mb, run_dir)
    coordinator = with_run_seed(config.coordinator)  # what runs, and what the summary records
    with EventLog(run_dir / EVENTS_FILENAME, clock=clock.now) as events, \
            contextlib.ExitStack() as stack:
        if config.run.tensorboard:
            from fedlink.observe import tensorboard  # an optional extra

            # the scalars' times: the run's start plus each flush's elapsed model seconds
            tensorboard.attach(events, run_dir, stack)
        training = training_backend(config.run.backend, BackendContext(
            config.virtual.workers, population, ConfigPopulation(config), config.ray.address,
            config.client.pipeline))
        try:  # the backend's workers (and a Ray it started) stop however the run ends
            loop = VirtualLoop(coordinator, initial, traced,
                               config.client.pipeline,
                               events, clock, loop_options(config),
                               availability, evaluate,
                               _profile_names(traced),
                               _printer(config.coordinator.rounds, clock, started) if progress
                               else None, training, residuals,
                               spec=None if experiment is None else experiment.spec())
            totals = loop.run()
        finally:
            training.close()
            residuals.close()
        recorded = events.events  # read back once from events.jsonl: the log keeps none
        summary = summarize(recorded, recorded_config(
            config.to_dict() if experiment is None else experiment.recorded_config(),
            coordinator))
        summary.update(federated_figures(recorded))
    summary.update(virtual_figures(totals, time.perf_counter() - started, loop))
    if experiment is not None:
        from fedlink.sim.runner import say_what_was_measured

        say_what_was_measured(summary, experiment)
        summary.update(experiment.data_figures())  # the partition, as a real run records it
    else:
        from fedlink.sim.runner import print_warning

        print_warning(summary)
    summary["training_processes"] = training.processes
    summary["training_backend"] = config.run.backend if config.virtual.workers else "inline"
    write_summary(run_dir / SUMMARY_FILENAME, summary)
    written = write_report(run_dir, recorded, summary) if report else None
    final = loop.engine.model.copy()
    state = experiment.save_model(run_dir, final) if experiment is not None else {}
    np.save(run_dir / VECTOR_FILENAME, final)
    return SimulationResult(summary, run_dir, written, (), state)


def check_backend(config: ExperimentConfig) -> None:
    """``[run] backend`` names a registered training backend or an import string (checked
    here, where a virtual run starts: the experiment config does not know the simulator's
    registry)."""
    backend = config.run.backend
    if backend not in BACKENDS:
        raise ConfigError(f"run.backend: must be one of {', '.join(BACKENDS.names())} or "
                          f"'package.module:attr', got {backend!r}")


def loop_options(config: ExperimentConfig) -> LoopOptions:
    """The loop's options from ``[virtual]``, seeded with ``[run] seed``."""
    section = config.virtual
    return LoopOptions(step_cost_s=section.step_cost_s, poll_s=section.poll_s,
                       deterministic=section.deterministic, seed=config.run.seed,
                       max_model_s=section.max_model_s or math.inf,
                       target_accuracy=config.run.target_accuracy)


def _check_plugs(config: ExperimentConfig, plugs: Plugs | None) -> None:
    """Plugged objects reach only this process: refused where workers would train without
    them, or where a synthetic population has no experiment to plug them into."""
    plugged = sorted(plugs.describe()) if plugs is not None else []
    if not plugged:
        return
    if config.virtual.workers > 0:
        raise ConfigError(f"run_simulation({', '.join(f'{p}=' for p in plugged)}) with [run] "
                          f"mode = 'virtual' and [virtual] workers = {config.virtual.workers}: "
                          f"worker processes build clients from the config alone. Set "
                          f"[virtual] workers = 0, or name the plugs by import string in the "
                          f"config ([model] factory, [data] loader, [client] trainer, ...)")
    if config.virtual.population > 0:
        raise ConfigError(f"run_simulation({', '.join(f'{p}=' for p in plugged)}) with "
                          f"[virtual] population > 0: a synthetic population has no model or "
                          f"data to replace")


def _build(config: ExperimentConfig, plugs: Plugs | None = None, evaluates: bool = True,
           worker: int = 0) -> tuple[Population, np.ndarray, Evaluate | None, Any]:
    """(population, initial model, evaluator, experiment or None); ``evaluates = False``:
    no evaluator (a training worker's copy, ``worker``: which one)."""
    section = config.virtual
    if section.population > 0:
        spec = SyntheticSpec(section.features, section.classes, seed=config.run.seed)
        synthetic = SyntheticPopulation(spec, section.population,
                                        Links(config.network, section.population))
        return synthetic, np.zeros(spec.num_parameters, np.float32), synthetic.evaluate, None
    import torch  # an experiment's data and trainers: torch, loaded only here

    from fedlink.experiment.setup import Experiment

    torch.set_num_threads(config.run.torch_threads)
    experiment = Experiment.build(config, plugs, worker=worker)
    experiment.check_simulated_trainer_options()
    size = experiment.data.num_clients
    population = ExperimentPopulation(Links(config.network, size), _task_trainers(experiment),
                                      size, experiment.client_examples)
    initial = experiment.initial_vector()
    evaluate = experiment.checked_evaluator(initial) if evaluates else None
    return population, initial, evaluate, experiment


def _task_trainers(experiment: Experiment) -> Callable[[int], Trainer]:
    """Builds each task's trainer. Where the experiment allows it, they all train in one
    working model, as pfl's workers do: a process trains its tasks one at a time, and a new
    model per task was a third of a small client's training time. There one factory, kept
    with the population, derives each task's trainer from the first (``WorkingModelTrainers``):
    building the factory and finding the module's tensors per task cost as much again."""
    if not experiment.may_share_working_model:
        return experiment.trainer
    from fedlink.client.torch_trainer import WorkingModelTrainers  # torch: loaded already

    working = WorkingModelTrainers(experiment.trainer_factory(), experiment.new_model())
    return functools.partial(experiment.trainer, model=working.model, factory=working)


def build_population(config: ExperimentConfig, worker: int = 0) -> Population:
    """The clients of a virtual run of ``config`` (what training worker ``worker`` builds
    once; its number picks its device, ``[client] device``)."""
    return _build(config, evaluates=False, worker=worker)[0]


def _profile_names(population: Population) -> Any:
    links = getattr(population, "links", None)
    return links.profile_name if isinstance(links, Links) else (lambda index: "ideal")


def _printer(rounds: int, clock: ManualClock, started: float) -> Any:
    def show(outcome: FlushOutcome, wall: float) -> None:
        print(f"round {outcome.version}/{rounds}  model time {_hms(clock.now())}  "
              f"wall {wall - started:.1f} s  updates {outcome.num_updates}", file=sys.stderr)

    return show


def _hms(seconds: float) -> str:
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours}h{rest // 60:02d}m{rest % 60:02d}s"


def virtual_figures(totals: LoopTotals, wall_s: float, loop: VirtualLoop) -> dict[str, Any]:
    """Summary entries only a virtual run has: model vs wall time, time shares by profile."""
    busy = totals.network_s + totals.compute_s
    return {
        "mode": "virtual",
        # the keys a real run has, meaning the same: process wall time from the first task to
        # the end (model time is model_seconds), clients that checked in, bytes downloaded
        "wall_seconds": totals.wall_s,
        "clients": totals.clients,
        "bytes_down": totals.bytes_down,
        "bytes_down_model": (totals.bytes_down - totals.bytes_down_evaluation
                             - totals.bytes_down_delta),
        "bytes_down_delta": totals.bytes_down_delta,
        "delta_bytes_saved": totals.delta_bytes_saved,
        "bytes_down_evaluation": totals.bytes_down_evaluation,
        "bytes_down_wasted": totals.bytes_down - totals.bytes_down_used,
        # a real run's from its download_finished events, which a virtual one does not log
        "downlink_compression_ratio": (4 * loop.engine.num_parameters * totals.downloads
                                       / totals.bytes_down if totals.bytes_down else None),
        "model_seconds": totals.model_s,
        "simulation_seconds": wall_s,
        "loop_wall_seconds": totals.wall_s,
        "client_network_seconds": totals.network_s,
        "client_train_seconds": totals.compute_s,
        "communication_share": totals.network_s / busy if busy else 0.0,
        "resent_bytes": totals.resent_bytes,
        "link_resets": totals.resets,
        "tasks": totals.tasks,
        "clients_with_kept_state": loop.kept_state_clients,
        "residuals_in_memory": loop.residuals.in_memory,
        "residuals_on_disk": loop.residuals.on_disk,
        "residual_spill_bytes": loop.residuals.spilled_bytes,
        **time_shares(totals.per_round, totals.per_profile),
        **({} if loop.secure is None else loop.secure.totals.figures()),
    }
