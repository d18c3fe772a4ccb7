"""``fedlink serve``: one coordinator process for clients on other processes or machines."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from dataclasses import replace
from pathlib import Path
from typing import Any

from fedlink.cli.notices import say_simulation_sections_ignored
from fedlink.coordinator import CoordinatorServer, serve_until_done
from fedlink.coordinator.faults import NO_FAULTS, FaultPlan
from fedlink.coordinator.lifecycle import target_rules
from fedlink.coordinator.state import holds_state
from fedlink.coordinator.stopping import stop_signals
from fedlink.errors import ConfigError
from fedlink.experiment.config import ExperimentConfig
from fedlink.metrics import (
    EVENTS_FILENAME,
    SUMMARY_FILENAME,
    EventLog,
    read_events,
    summarize,
    write_report,
    write_summary,
)
from fedlink.metrics.federated import federated_figures


async def serve(config_path: Path, address: str, output_dir: Path | None,
                state_dir: Path | None = None, metrics_port: int | None = None,
                metrics_host: str | None = None, faults: FaultPlan = NO_FAULTS) -> int:
    """Serve the run described by ``config_path`` until it ends or a signal stops it.

    With a ``state_dir`` (the argument, else ``[coordinator] state_dir``) that holds a run,
    the run resumes: its event log is appended to, and the summary covers the whole run.
    ``metrics_port`` and ``metrics_host`` (else ``[coordinator.metrics]``) serve Prometheus
    metrics; either turns them on. ``faults``: a fault-injection test's plan (none by default).
    """
    with stop_signals() as stop:  # from the start: a stop while building is a stop too
        return await _serve(config_path, address, output_dir, state_dir, metrics_port,
                            metrics_host, faults, stop)


async def _serve(config_path: Path, address: str, output_dir: Path | None,
                 state_dir: Path | None, metrics_port: int | None, metrics_host: str | None,
                 faults: FaultPlan, stop: asyncio.Event) -> int:
    """``serve``, with ``stop`` set by a signal."""
    # The set-up imports what the config's model and data need (torch for the built-in
    # models), so it is loaded only once there is a config to serve.
    from fedlink.experiment.run_folder import prepare_run_dir
    from fedlink.experiment.setup import Experiment

    config = ExperimentConfig.from_toml(config_path)
    _check_servable(config)  # before the command line's overrides, which a virtual file refuses
    if state_dir is not None:
        config = replace(config, coordinator=replace(config.coordinator,
                                                     state_dir=str(state_dir)))
    if metrics_port is not None or metrics_host is not None:
        metrics = config.coordinator.metrics
        config = replace(config, coordinator=replace(config.coordinator, metrics=replace(
            metrics, enabled=True, port=metrics.port if metrics_port is None else metrics_port,
            host=metrics_host or metrics.host)))
    resuming = holds_state(config.coordinator.state_dir)
    experiment = Experiment.build(config)
    run_dir = prepare_run_dir(config, output_dir, keep_records=resuming)
    host = address.rsplit(":", 1)[0]

    def announce(port: int) -> None:
        print(f"fedlink coordinator for run {config.run.name!r} listening on {host}:{port}",
              flush=True)

    def record() -> dict[str, Any]:
        """Write ``summary.json`` and the model (each atomically, 0600) from what is logged
        so far; returns the summary."""
        everything = read_events(run_dir / EVENTS_FILENAME)  # every process's, when resumed
        summary = summarize(everything, config.to_dict())
        summary.update(experiment.data_figures())
        summary.update(federated_figures(everything))
        # the coordinator holds no client's kept tensors: its model.pt has their initial
        # values, and the record says so (a simulation fills them from its clients)
        final = server.service.lifecycle.final_model
        kept_local = experiment.fill_kept_local(final, ())[1]
        if kept_local:
            summary["kept_local"] = kept_local
        write_summary(run_dir / SUMMARY_FILENAME, summary)
        experiment.save_model(run_dir, final)
        return summary

    initial = experiment.initial_vector()
    evaluator = experiment.checked_evaluator(initial)  # refused before a log is opened
    with EventLog(run_dir / EVENTS_FILENAME, resume=resuming) as events, \
            contextlib.ExitStack() as stack:
        server = CoordinatorServer(config.coordinator, initial, events,
                                   evaluator=evaluator, address=address,
                                   faults=faults, spec=experiment.spec(),
                                   stop_rules=target_rules(config.run.target_accuracy))
        if config.coordinator.metrics.enabled:
            from fedlink.observe.endpoint import serve_metrics  # an optional extra

            serve_metrics(server, stack)
        if config.run.tensorboard:
            from fedlink.observe import tensorboard  # an optional extra

            tensorboard.attach(events, run_dir, stack)
        await serve_until_done(server, on_started=announce, stop=stop, on_record=record)
    summary = record()  # again, complete: the run's end and everything drained is in
    print(f"report: {write_report(run_dir, read_events(run_dir / EVENTS_FILENAME), summary)}",
          flush=True)
    # What is left is the interpreter's exit; its last garbage collection walks every object
    # torch made (seconds on a loaded machine, inside a supervisor's stop
    # timeout). Nothing left needs collecting: frozen objects are skipped.
    gc.freeze()
    return 0


def _check_servable(config: ExperimentConfig) -> None:
    """A served coordinator's clients are real: a virtual-mode config is a simulation's
    (refused), and the sections that shape simulated clients are said to be ignored here
    (they stay in the file the clients may read their own settings from)."""
    if config.run.mode != "grpc":
        raise ConfigError(f"run.mode: {config.run.mode!r} runs a simulation on the virtual "
                          f"clock (fedlink simulate); fedlink serve serves real clients. "
                          f"Use fedlink simulate, or remove [run] mode")
    say_simulation_sections_ignored(config, "fedlink serve",
                                    "served clients bring their own links and training")
