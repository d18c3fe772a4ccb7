"""Asynchronous aggregation: memory of a long FedBuff stream, and time to accuracy by mode.

**Memory.** 1,000 updates (``--quick``: 200) of a 1M-parameter model (4 MB of float32) through
the ``RoundEngine`` directly, with the ``async`` preset (K = 10, 30 tasks in flight, updates
delivered in random order so they arrive stale). A warm-up first fills the engine's fixed
holdings: the float64 accumulator, the payloads of the versions a stale client may still
download (``max_staleness + 1``) and the delta history. Figures, in model sizes:
``peak_memory_ratio`` (the peak of traced memory while aggregating the 1,000 updates, above the
steady state; target < 3), ``retained_ratio`` (what is left after them) with
``retained_bytes_per_update`` (about 1 KB before issue 13, the event log's two events per
update; near 0 since the log streams to a file: no model data accumulates either) and
``steady_state_ratio`` (the fixed holdings, for reference: they depend on ``max_staleness``
and ``delta_history``, not on the number of updates).

**Time to accuracy.** digits, 20 clients (full: 50) with 30% stragglers computing 5x slower,
``sync`` (the baseline: every version waits for all clients), ``elastic`` and ``async``
(FedBuff), each run in this process: wall seconds from the start of the run to the first model
version at ``target_accuracy``. Figures: ``sync_seconds``, ``elastic_seconds``,
``async_seconds`` and the speedups ``elastic_speedup`` / ``async_speedup`` (sync seconds over
the mode's seconds). A mode that never reaches the target reports 0 seconds and speedup 0.

Run: ``python benchmarks/async_memory.py [--quick] [--json FILE]``
"""

from __future__ import annotations

import json
import logging
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import parse_args, report

from fedlink.coordinator import CoordinatorConfig, RoundEngine
from fedlink.coordinator.config import FlushRule
from fedlink.coordinator.engine import ReceivedUpdate
from fedlink.errors import UpdateRefused
from fedlink.messages import Task
from fedlink.metrics import EventLog
from fedlink.sim import ExperimentConfig, run_simulation

PARAMS = 1_000_000
MODEL_BYTES = 4 * PARAMS


# -- memory ---------------------------------------------------------------------------------------

class Stream:
    """Clients that take a task whenever they are free and finish in random order."""

    def __init__(self, engine: RoundEngine, deltas: list[np.ndarray], seed: int = 0) -> None:
        self.engine = engine
        self.deltas = deltas
        self.rng = np.random.default_rng(seed)
        self.clients = [f"c{i}" for i in range(engine.rule.cohort)]
        self.in_flight: dict[str, Task] = {}
        self.sent = self.refused = 0
        self.staleness: list[int] = []

    def refill(self) -> None:
        """Every free client asks for a task."""
        for client in self.clients:
            if client not in self.in_flight:
                reply = self.engine.issue(client)
                if isinstance(reply, Task):
                    self.in_flight[client] = reply

    def run(self, updates: int) -> None:
        """Deliver ``updates`` updates, one from a random client in flight at a time."""
        self.refill()
        for _ in range(updates):
            names = sorted(self.in_flight)
            client = names[int(self.rng.integers(len(names)))]
            task = self.in_flight.pop(client)
            delta = self.deltas[self.sent % len(self.deltas)]
            self.sent += 1
            try:
                accepted = self.engine.submit(ReceivedUpdate(
                    client, task.task_id, task.model_version, delta, 10, 5, 5, MODEL_BYTES))
                self.staleness.append(accepted.staleness)
            except UpdateRefused:
                self.refused += 1
            self.refill()


def memory_figures(updates: int) -> dict[str, Any]:
    """Aggregate ``updates`` updates of a 1M-parameter model in async mode under tracemalloc."""
    rule = FlushRule.from_preset("async", goal=10)
    config = CoordinatorConfig(rounds=10**6, flush=rule, staleness_weight="polynomial")
    rng = np.random.default_rng(0)
    deltas = [rng.normal(scale=1e-3, size=PARAMS).astype(np.float32) for _ in range(3)]
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        engine = RoundEngine(config, np.zeros(PARAMS, np.float32), EventLog(None))
        stream = Stream(engine, deltas)
        stream.run((rule.max_staleness + config.limits.delta_history + 2) * rule.goal)
        steady, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        stream.staleness.clear()
        started = time.perf_counter()
        stream.run(updates)
        seconds = time.perf_counter() - started
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return {
        "memory_updates": updates,
        "memory_parameters": PARAMS,
        "peak_memory_ratio": (peak - steady) / MODEL_BYTES,
        "retained_ratio": (current - steady) / MODEL_BYTES,
        "retained_bytes_per_update": (current - steady) / updates,
        "steady_state_ratio": (steady - before) / MODEL_BYTES,
        "mean_staleness": float(np.mean(stream.staleness)),
        "aggregation_updates_per_second": updates / seconds,
    }


# -- time to accuracy -----------------------------------------------------------------------------

def flush_table(mode: str, clients: int) -> dict[str, Any]:
    """The ``[coordinator.flush]`` table of ``mode`` for ``clients`` clients."""
    return {
        "sync": {"preset": "sync", "goal": clients},
        "elastic": {"preset": "elastic", "goal": clients // 2, "deadline_s": 5.0},
        "async": {"preset": "async", "goal": max(2, clients * 3 // 10), "over_selection": 1.5},
    }[mode]


def mode_config(mode: str, clients: int, rounds: int) -> ExperimentConfig:
    """digits with a 30%-straggler fleet (5x slower compute) under flush mode ``mode``.

    Every mode gets the same budget of client updates, ``rounds x clients`` (``sync``'s
    ``rounds`` rounds); only the time to the target counts, the budget bounds the run.
    """
    flush = flush_table(mode, clients)
    budget = rounds * clients
    stale = {} if mode == "sync" else {  # sync accepts fresh updates only: nothing to discount
        "staleness_weight": "polynomial", "staleness_weight_options": {"a": 0.5}}
    return ExperimentConfig.from_dict({
        "run": {"name": f"bench-async-{mode}", "seed": 0},
        "data": {"dataset": "digits", "clients": clients, "partition": "iid"},
        "model": {"name": "mlp", "options": {"hidden": [64, 64]}},
        "coordinator": {
            "rounds": budget // flush["goal"],
            "flush": flush,
            **stale,
            "training": {"local_epochs": 3, "batch_size": 32, "learning_rate": 0.2},
        },
        "network": {"preset": "lan",
                    "speed": {"kind": "choice", "values": [1.0, 5.0], "weights": [0.7, 0.3]}},
    })


def time_to_accuracy(config: ExperimentConfig, target: float, out: Path) -> tuple[float, float]:
    """(seconds from run start to the first version at ``target`` (0: never), best accuracy)."""
    result = run_simulation(config, out, progress=False)
    events = [json.loads(line) for line in (result.run_dir / "events.jsonl").open()]
    start = next(e["elapsed"] for e in events if e["kind"] == "run_started")
    flushes = [e for e in events if e["kind"] == "flush" and "accuracy" in e]
    reached = [e["elapsed"] - start for e in flushes if e["accuracy"] >= target]
    return (reached[0] if reached else 0.0), max(e["accuracy"] for e in flushes)


def accuracy_figures(clients: int, rounds: int, target: float) -> dict[str, Any]:
    """Time to ``target`` accuracy for sync, elastic and async, and the speedups over sync."""
    figures: dict[str, Any] = {"tta_clients": clients, "target_accuracy": target}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("sync", "elastic", "async"):
            seconds, best = time_to_accuracy(mode_config(mode, clients, rounds), target,
                                             Path(tmp))
            figures[f"{mode}_seconds"] = seconds
            figures[f"{mode}_best_accuracy"] = best
    for mode in ("elastic", "async"):
        seconds = figures[f"{mode}_seconds"]
        figures[f"{mode}_speedup"] = figures["sync_seconds"] / seconds if seconds else 0.0
    return figures


def main() -> None:
    """Run both parts and print (and optionally save) the figures."""
    args = parse_args(__doc__.splitlines()[0])
    logging.disable(logging.WARNING)  # refused-too-stale warnings are expected here
    figures = memory_figures(200 if args.quick else 1000)
    clients, rounds = (20, 30) if args.quick else (50, 80)
    figures.update(accuracy_figures(clients, rounds, target=0.9))
    report(figures, args.json)


if __name__ == "__main__":
    main()
