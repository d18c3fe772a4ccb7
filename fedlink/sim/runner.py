"""``fedlink simulate``: a coordinator and N SDK clients in one process, over real gRPC.

The coordinator listens on a free loopback port; every client is a real ``ClientSession``
with its own channel. Local training runs on a small thread pool (``run.train_workers``) so
the event loop stays free for gRPC, or, with ``run.train_workers = 0`` (the default), on the
event loop's thread itself, which is fastest for many small simulated clients (see
``ClientSession``). At the end the run folder holds ``events.jsonl``,
``summary.json`` and ``report.md`` with its plots.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fedlink.client import ClientOptions, ClientSession, SessionStats, Trainer, UpdatePipeline
from fedlink.coordinator import CoordinatorServer
from fedlink.metrics import (
    EVENTS_FILENAME,
    SUMMARY_FILENAME,
    EventLog,
    RunProgress,
    summarize,
    write_report,
    write_summary,
)
from fedlink.sim.config import ExperimentConfig
from fedlink.sim.setup import Experiment

PROGRESS_POLL_S = 0.2


@dataclass(frozen=True)
class SimulationResult:
    """What a finished simulation produced."""

    summary: dict[str, Any]
    run_dir: Path
    report: Path
    client_stats: tuple[SessionStats, ...]


def run_simulation(config: ExperimentConfig, output_dir: Path | None = None,
                   progress: bool = True) -> SimulationResult:
    """Run the experiment to the end and write its run folder; returns the summary."""
    torch.set_num_threads(config.run.torch_threads)
    experiment = Experiment.build(config)
    run_dir = Path(output_dir or config.run.output_dir) / config.run.name
    run_dir.mkdir(parents=True, exist_ok=True)
    events_path = run_dir / EVENTS_FILENAME
    events_path.unlink(missing_ok=True)  # a re-run replaces the previous run's log
    with EventLog(events_path) as events:
        started = time.monotonic()
        stats = asyncio.run(_simulate(experiment, events, progress))
        summary = summarize(events.events, config.to_dict())
    summary.update(_client_figures(stats, time.monotonic() - started))
    write_summary(run_dir / SUMMARY_FILENAME, summary)
    report = write_report(run_dir, events.events, summary)
    return SimulationResult(summary, run_dir, report, stats)


async def _simulate(experiment: Experiment, events: EventLog,
                    progress: bool) -> tuple[SessionStats, ...]:
    config = experiment.config
    server = CoordinatorServer(config.coordinator, experiment.initial_vector(), events,
                               evaluator=experiment.evaluator())
    # Trainers first: building one converts its data and warms torch up, which is set-up
    # cost, not part of the run.
    trainers = [experiment.trainer(i) for i in range(experiment.data.num_clients)]
    workers = max(1, config.run.train_workers)
    with ThreadPoolExecutor(workers, thread_name_prefix="train") as pool:
        async with server:
            target = f"127.0.0.1:{server.port}"
            sessions = [_session(config, i, trainer, target, pool)
                        for i, trainer in enumerate(trainers)]
            with RunProgress(config.coordinator.rounds, enabled=progress) as bar:
                watcher = asyncio.create_task(_watch(events, bar))
                try:
                    stats = await asyncio.gather(*(s.run() for s in sessions))
                    await server.wait_finished()
                finally:
                    watcher.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await watcher
                _show(events, bar)
    return tuple(stats)


def _session(config: ExperimentConfig, index: int, trainer: Trainer, target: str,
             pool: ThreadPoolExecutor) -> ClientSession:
    options = ClientOptions(name=f"sim-{index}", seed=config.run.seed * 1_000_003 + index)
    pipeline = UpdatePipeline.from_names(config.client.privacy, config.client.compression)
    return ClientSession(target, trainer, options, pipeline, executor=pool,
                         inline_training=config.run.train_workers == 0)


async def _watch(events: EventLog, bar: RunProgress) -> None:
    while True:
        _show(events, bar)
        await asyncio.sleep(PROGRESS_POLL_S)


def _show(events: EventLog, bar: RunProgress) -> None:
    flushes = events.of_kind("flush")
    if not flushes:
        return
    last = flushes[-1]
    bytes_up = sum(e.get("bytes_up", 0) for e in flushes)
    bytes_down = sum(e.get("bytes_down", 0) for e in flushes)
    bar.update(len(flushes), last.get("accuracy"), bytes_up, bytes_down)


def _client_figures(stats: tuple[SessionStats, ...], wall: float) -> dict[str, Any]:
    """Client-side totals that only the clients know."""
    return {
        "client_retries": sum(s.retries for s in stats),
        "client_train_seconds": sum(s.train_seconds for s in stats),
        "simulation_seconds": wall,
    }
