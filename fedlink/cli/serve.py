"""``fedlink serve``: one coordinator process for clients on other processes or machines."""

from __future__ import annotations

from pathlib import Path

from fedlink.coordinator import CoordinatorServer, serve_until_done
from fedlink.coordinator.server import save_model
from fedlink.metrics import (
    EVENTS_FILENAME,
    SUMMARY_FILENAME,
    EventLog,
    summarize,
    write_report,
    write_summary,
)
from fedlink.sim.config import ExperimentConfig
from fedlink.sim.setup import Experiment, prepare_run_dir


async def serve(config_path: Path, address: str, output_dir: Path | None) -> int:
    """Serve the run described by ``config_path`` until it ends or a signal stops it."""
    config = ExperimentConfig.from_toml(config_path)
    experiment = Experiment.build(config)
    run_dir = prepare_run_dir(config, output_dir)
    host = address.rsplit(":", 1)[0]

    def announce(port: int) -> None:
        print(f"fedlink coordinator for run {config.run.name!r} listening on {host}:{port}",
              flush=True)

    with EventLog(run_dir / EVENTS_FILENAME) as events:
        server = CoordinatorServer(config.coordinator, experiment.initial_vector(), events,
                                   evaluator=experiment.evaluator(), address=address)
        await serve_until_done(server, on_started=announce)
        summary = summarize(events.events, config.to_dict())
    write_summary(run_dir / SUMMARY_FILENAME, summary)
    save_model(run_dir / "model.npy", server.service.engine.model)
    print(f"report: {write_report(run_dir, events.events, summary)}", flush=True)
    return 0
