"""Time to accuracy on a poor network with stragglers: sync vs elastic vs async rounds.

Digits (MLP 64-64-10), 50 clients (IID), each behind its own emulated link: half on ``3g``,
half on ``flaky`` (5 s blackouts about every 30 s), and 30% of them compute 5x slower
(``[network.speed] kind = "choice", values = [1, 5], weights = [0.7, 0.3]``). Every client
trains the same way (5 local epochs, batch 8, lr 0.1). Three runs in this process, each
stopped once a flush reaches 90% test accuracy (``[run] target_accuracy``):

- ``sync`` (the baseline): plain synchronous FedAvg, ``preset = "sync"``, ``goal = 10``: each
  round asks 10 clients and waits for all 10;
- ``elastic``: the same 10 updates per round, from ``ceil(10 x 2.0) = 20`` clients asked,
  a 4 s deadline with at least 5 in, updates up to 2 versions late discounted by
  ``(1 + tau) ** -0.5``;
- ``async``: FedBuff, 20 clients training at once on the latest model, a flush every 10
  updates, staleness up to 10 discounted by ``(1 + tau) ** -0.5``, server lr 1.

Figures: ``sync_seconds``, ``elastic_seconds``, ``async_seconds`` (wall seconds from the
coordinator's start to the first flush at >= 90% test accuracy), ``elastic_speedup`` and
``async_speedup`` (sync / mode), and each mode's flush count at that point. Target: both
speedups >= 2.5. ``--quick``: 30 clients instead of 50 (same fleet mix, same cohort
settings), about 70 s in all; with fewer, larger clients 90% comes in fewer rounds, so fewer
blackouts hit the sync baseline and the speedups are smaller (about 2x) than the full run's.
Measured on 2 CPU cores, full run (about 2 min 15 s): elastic 3.2-4.2x, async 2.9-3.0x; the
spread comes mostly from when the ``flaky`` links' blackouts fall.

Run: ``python benchmarks/time_to_accuracy.py [--quick] [--json FILE]``
"""

from __future__ import annotations

import logging
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _common import parse_args, report

from fedlink.metrics.events import read_events
from fedlink.sim import ExperimentConfig, run_simulation

TARGET = 0.9
MAX_ROUNDS = {"sync": 60, "elastic": 120, "async": 300}
"""Caps on model versions, far above what reaching the target takes (a run stops there)."""


def flush_table(mode: str, goal: int) -> dict[str, Any]:
    """``[coordinator.flush]`` and the staleness/optimizer keys of ``mode``."""
    stale = {"staleness_weight": "polynomial", "staleness_weight_options": {"a": 0.5}}
    if mode == "sync":
        return {"flush": {"preset": "sync", "goal": goal}}
    if mode == "elastic":
        return {"flush": {"preset": "elastic", "goal": goal, "over_selection": 2.0,
                          "deadline_s": 4.0, "min_updates": max(1, goal // 2),
                          "max_staleness": 2}, **stale}
    return {"flush": {"preset": "async", "goal": goal, "over_selection": 2.0,
                      "max_staleness": 10},
            "server_optimizer": "fedavg", "server_optimizer_options": {"lr": 1.0}, **stale}


def experiment(mode: str, clients: int, goal: int, seed: int = 0) -> ExperimentConfig:
    """One mode's experiment; everything but the flush rule is the same for all three."""
    return ExperimentConfig.from_dict({
        "run": {"name": f"bench-tta-{mode}", "seed": seed, "target_accuracy": TARGET},
        "data": {"dataset": "digits", "clients": clients, "partition": "iid"},
        "model": {"name": "mlp", "options": {"hidden": [64, 64]}},
        "coordinator": {
            "rounds": MAX_ROUNDS[mode],
            **flush_table(mode, goal),
            "training": {"local_epochs": 5, "batch_size": 8, "learning_rate": 0.1},
            "limits": {"long_poll_s": 2.0, "retry_after_s": 0.5},
        },
        "network": {"fleet": {"3g": 0.5, "flaky": 0.5},
                    "speed": {"kind": "choice", "values": [1, 5], "weights": [0.7, 0.3]}},
    })


def time_to_target(run_dir: Path) -> tuple[float | None, int]:
    """(seconds from ``run_started`` to the first flush at >= TARGET, flushes by then)."""
    events = read_events(run_dir / "events.jsonl")
    start = next(e["elapsed"] for e in events if e["kind"] == "run_started")
    flushes = [e for e in events if e["kind"] == "flush"]
    for count, flush in enumerate(flushes, 1):
        if (flush.get("accuracy") or 0.0) >= TARGET:
            return float(flush["elapsed"]) - float(start), count
    return None, len(flushes)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    clients, goal = (30, 10) if args.quick else (50, 10)
    logging.getLogger("fedlink").setLevel(logging.ERROR)  # late/refused updates are expected
    figures: dict[str, Any] = {"clients": clients, "goal": goal}
    with tempfile.TemporaryDirectory() as scratch:
        for mode in ("sync", "elastic", "async"):
            result = run_simulation(experiment(mode, clients, goal), Path(scratch),
                                    progress=False)
            seconds, flushes = time_to_target(result.run_dir)
            figures[f"{mode}_seconds"] = seconds
            figures[f"{mode}_flushes"] = flushes
            print(f"{mode}: {seconds if seconds is None else round(seconds, 1)} s, "
                  f"{flushes} flushes", flush=True)
    sync = figures["sync_seconds"]
    for mode in ("elastic", "async"):
        other = figures[f"{mode}_seconds"]
        figures[f"{mode}_speedup"] = None if not (sync and other) else sync / other
    report(figures, args.json)


if __name__ == "__main__":
    main()
