"""Framework overhead of a simulated run: fedlink over gRPC vs the same training in-process.

20 clients x 10 rounds of synchronous FedAvg on digits (MLP 64-64-10, 1 local epoch, batch 32,
lr 0.05). The baseline trains the same clients from the same seeds sequentially in this
process, aggregates with the same streaming mean and evaluates each round, with no gRPC.

Figures: ``wall_seconds`` (first call to last flush of the fedlink run), ``baseline_seconds``,
``overhead_ms_per_update`` ((wall - baseline) / updates: the baseline is exactly the local
training and evaluation work, so this is everything fedlink adds, contention included),
``overhead_ms_per_update_vs_train`` ((wall - local training time measured inside the run)
/ updates),
``baseline_ratio`` (wall / baseline), ``peak_rss_mb`` (whole process), ``final_accuracy``.
Targets: overhead <= 5 ms per update, peak RSS <= 600 MB.

On a 2-core machine one pair's overhead varies by tens of percent from run to run (scheduling
of the coordinator, 20 clients and the evaluation thread), so the pair is run ``REPEATS``
times and the figures are those of the median pair; ``overhead_ms_per_update_min``/``_max``
show the spread.

Run: ``python benchmarks/sim_overhead.py [--quick] [--json FILE]``
"""

from __future__ import annotations

import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _common import parse_args, report

from fedlink.aggregate import StreamingMean
from fedlink.client import TrainPlan
from fedlink.experiment.setup import Experiment
from fedlink.sim import ExperimentConfig, run_simulation

REPEATS = 5
"""Paired runs (fedlink, then the baseline); the figures are those of the median overhead."""


def experiment_config(clients: int, rounds: int) -> ExperimentConfig:
    """The benchmark's experiment: sync FedAvg on digits, as the issue specifies."""
    return ExperimentConfig.from_dict({
        "run": {"name": "bench-sim-overhead", "seed": 0},
        "data": {"dataset": "digits", "clients": clients, "partition": "iid"},
        "model": {"name": "mlp", "options": {"hidden": [64, 64]}},
        "coordinator": {
            "rounds": rounds,
            "flush": {"goal": clients, "min_updates": clients, "deadline_s": 120.0},
            "training": {"local_epochs": 1, "batch_size": 32, "learning_rate": 0.05},
        },
    })


def baseline(config: ExperimentConfig) -> tuple[float, float]:
    """The same rounds sequentially in-process: (seconds, final accuracy)."""
    experiment = Experiment.build(config)
    trainers = [experiment.trainer(i) for i in range(config.data.clients)]
    evaluate = experiment.evaluator()
    training = config.coordinator.training
    model = experiment.initial_vector()
    rng = np.random.default_rng(config.run.seed)
    accuracy = 0.0
    started = time.perf_counter()
    for _ in range(config.coordinator.rounds):
        mean = StreamingMean()
        for trainer in trainers:
            plan = TrainPlan(local_epochs=training.local_epochs, batch_size=training.batch_size,
                             learning_rate=training.learning_rate,
                             seed=int(rng.integers(2**31)))
            result = trainer.train(model, plan)
            mean.add(result.params - model, result.num_examples)
        model = model + mean.mean()
        accuracy = evaluate(model)["accuracy"]
    return time.perf_counter() - started, accuracy


def warm_up(config: ExperimentConfig) -> None:
    """Pay torch's one-time lazy initialisation (about 1 s at the first optimizer step).

    Without this, whichever of the two runs goes first is charged for it.
    """
    experiment = Experiment.build(config)
    experiment.trainer(0).train(experiment.initial_vector(), TrainPlan(local_steps=1))


def measure_once(config: ExperimentConfig) -> dict[str, float]:
    """One fedlink run and one in-process baseline of the same rounds, back to back."""
    with tempfile.TemporaryDirectory() as out:
        summary = run_simulation(config, Path(out), progress=False).summary
    base_seconds, base_accuracy = baseline(config)
    updates = summary["updates_accepted"]
    wall = summary["wall_seconds"]
    return {
        "updates": updates,
        "wall_seconds": wall,
        "train_seconds": summary["client_train_seconds"],
        "baseline_seconds": base_seconds,
        "overhead_ms_per_update": 1000 * (wall - base_seconds) / updates,
        "overhead_ms_per_update_vs_train":
            1000 * (wall - summary["client_train_seconds"]) / updates,
        "final_accuracy": summary["final_accuracy"],
        "baseline_final_accuracy": base_accuracy,
    }


def main() -> None:
    """Run both ``REPEATS`` times, print the median pair's figures and the ratio."""
    args = parse_args(__doc__ or "")
    torch.set_num_threads(1)
    clients, rounds = (20, 5) if args.quick else (20, 10)
    config = experiment_config(clients, rounds)
    warm_up(config)
    runs = sorted((measure_once(config) for _ in range(REPEATS)),
                  key=lambda run: run["overhead_ms_per_update"])
    median = runs[len(runs) // 2]
    figures = {
        "clients": clients,
        "rounds": rounds,
        "repeats": REPEATS,
        **median,
        "baseline_ratio": median["wall_seconds"] / median["baseline_seconds"],
        "overhead_ms_per_update_min": runs[0]["overhead_ms_per_update"],
        "overhead_ms_per_update_max": runs[-1]["overhead_ms_per_update"],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    report(figures, args.json)


if __name__ == "__main__":
    main()
