"""Error-feedback residuals of a virtual population: kept within a memory budget, spilled to
disk beyond it, and read back exactly."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from fedlink.experiment.config import ExperimentConfig
from fedlink.sim.virtual.residuals import MB, ResidualStore


def test_residuals_beyond_the_budget_are_spilled_and_read_back_exactly(tmp_path: Path) -> None:
    vectors = {i: np.random.default_rng(i).normal(size=1000).astype(np.float32)
               for i in range(10)}
    store = ResidualStore(memory_mb=3 * 4000 / MB, directory=tmp_path)  # room for three
    for index, vector in vectors.items():
        store.put(index, vector.copy())
    assert store.in_memory == 3 and store.on_disk == 7
    assert store.spilled_bytes == 7 * 4000
    assert list(tmp_path.iterdir()) == []  # the spill file is unlinked: no crash leaves it
    for index in (0, 9, 4):
        np.testing.assert_array_equal(store.take(index), vectors[index])
    assert store.take(42) is None  # a client that never trained has none
    store.put(0, vectors[0] * 2)  # a later residual replaces the spilled one
    for index in range(1, 9):
        store.put(index + 100, vectors[index])  # pushes client 0 out to its old slot
    np.testing.assert_array_equal(store.take(0), vectors[0] * 2)
    store.close()


def test_an_unbounded_store_never_touches_disk() -> None:
    store = ResidualStore(math.inf)
    for index in range(100):
        store.put(index, np.ones(10, np.float32))
    assert store.in_memory == 100 and store.on_disk == 0 and store.spilled_bytes == 0


def test_a_run_that_spills_every_residual_ends_at_the_same_model(tmp_path: Path) -> None:
    from fedlink.sim import run_simulation

    def run(name: str, memory_mb: float) -> dict[str, object]:
        config = ExperimentConfig.from_dict({
            "run": {"name": name, "seed": 6, "mode": "virtual"},
            "client": {"compression": "topk", "compression_options": {"density": 0.1}},
            "coordinator": {"rounds": 4, "flush": {"goal": 8, "deadline_s": 0}},
            "virtual": {"population": 20, "deterministic": True,
                        "residual_memory_mb": memory_mb},
        })
        result = run_simulation(config, tmp_path, progress=False)
        result.summary["model"] = np.load(result.run_dir / "model.npy")
        return result.summary

    roomy, tight = run("roomy", 1024.0), run("tight", 0.0)
    assert roomy["residuals_on_disk"] == 0 and roomy["residuals_in_memory"] > 0
    assert tight["residuals_in_memory"] == 0 and tight["residuals_on_disk"] > 0
    np.testing.assert_array_equal(tight["model"], roomy["model"])
    assert tight["residual_spill_bytes"] > 0
