"""A BatchNorm CNN on CIFAR-10 over emulated links: the real data when you placed it, a generated
stand-in otherwise (it says which it used).

    python examples/cifar10_cnn.py [--root data] [--rounds 20] [--output-dir runs]

fedlink never downloads data at run time. For the real thing, download
https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz and extract it so that
``<root>/cifar-10-batches-py/data_batch_1`` exists. Without it, the stand-in is the same shape
(3 x 32 x 32 images, 10 classes): per-class colour patterns plus noise, small enough to run on
a laptop in a minute; its accuracy says the pipeline works, not how CIFAR-10 would go.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from fedlink.data import CentralData, Dataset
from fedlink.sim import ExperimentConfig, run_simulation

FEATURES, CLASSES = 3 * 32 * 32, 10


def stand_in(*, num_clients: int, seed: int, n_train: int = 2000,
             n_test: int = 500) -> CentralData:
    """CIFAR-10-shaped images: a random 3 x 32 x 32 prototype per class, plus noise."""
    rng = np.random.default_rng(seed)
    prototypes = rng.random((CLASSES, FEATURES), dtype=np.float32)

    def split(n: int, name: str) -> Dataset:
        y = rng.integers(0, CLASSES, n)
        noise = rng.normal(0.0, 0.35, (n, FEATURES)).astype(np.float32)
        return Dataset(np.clip(prototypes[y] + noise, 0, 1), y, CLASSES, FEATURES, name)

    return CentralData(split(n_train, "stand-in-train"), split(n_test, "stand-in-test"))


def config(root: Path, rounds: int) -> tuple[ExperimentConfig, str]:
    """The experiment, and which data it uses."""
    real = (root / "cifar-10-batches-py" / "data_batch_1").is_file()
    data = ({"dataset": "cifar10", "options": {"root": str(root)}} if real
            else {"loader": "cifar10_cnn:stand_in"})  # the loader is this file's stand_in
    table = {
        "run": {"name": "cifar10-cnn", "seed": 0},
        "data": {**data, "clients": 10, "partition": "dirichlet"},
        "model": {"name": "cnn", "options": {"channels": 3, "widths": [16, 32, 64]}},
        "client": {"optimizer": "sgd", "optimizer_options": {"momentum": 0.9,
                                                             "weight_decay": 5e-4}},
        "coordinator": {"rounds": rounds, "flush": {"goal": 10, "deadline_s": 600.0},
                        "training": {"local_epochs": 1, "batch_size": 32,
                                     "learning_rate": 0.02}},
        "network": {"fleet": {"wifi-good": 0.5, "4g": 0.5}},
    }
    which = f"real CIFAR-10 from {root}" if real else (
        f"a generated stand-in (no CIFAR-10 under {root}/cifar-10-batches-py)")
    return ExperimentConfig.from_dict(table), which


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("data"))
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--output-dir", type=Path, default=Path("runs"))
    args = parser.parse_args()
    experiment, which = config(args.root, args.rounds)
    print(f"data: {which}", flush=True)
    result = run_simulation(experiment, args.output_dir, progress=False)
    print(f"data: {which}; final accuracy {result.summary['final_accuracy']:.3f}")
    print(f"report: {result.report}; model: {result.run_dir / 'model.pt'}")
