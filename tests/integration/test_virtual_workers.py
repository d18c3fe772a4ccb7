"""``[virtual] workers``: clients trained in worker processes give the run the loop alone gives.

A worker trains the same client from the same model with the same plan as the loop's process,
and runs its update pipeline with the client's own generator and residual, and the loop takes
results in model-time order, so a run with a pool of worker processes must
accept the same updates in the same flushes and end at the same model as one without.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import accepted_updates, virtual_backend_config

from fedlink.errors import ConfigError

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(240)



def test_two_worker_processes_give_the_same_run_as_the_loop_alone(tmp_path: Path) -> None:
    from fedlink.sim import run_simulation

    alone = run_simulation(virtual_backend_config(0, "alone"), tmp_path, progress=False)
    pooled = run_simulation(virtual_backend_config(2, "pooled"), tmp_path, progress=False)
    assert len(accepted_updates(alone.run_dir)) >= 3 * 4
    assert alone.summary["training_processes"] == 1
    assert pooled.summary["training_processes"] == 2  # both workers trained clients
    assert accepted_updates(pooled.run_dir) == accepted_updates(alone.run_dir)
    np.testing.assert_allclose(np.load(pooled.run_dir / "model.npy"),
                               np.load(alone.run_dir / "model.npy"), atol=1e-6)
    assert pooled.summary["final_accuracy"] == pytest.approx(alone.summary["final_accuracy"])


def test_workers_run_the_clients_noise_and_compression_as_the_loop_alone_does(
        tmp_path: Path) -> None:
    """The pipeline runs in the worker: local DP noise from each client's own generator and
    top-k with error feedback (each client's residual carried from task to task) give the
    same updates and the same model as the loop's process alone."""
    from fedlink.sim import run_simulation

    client = {"privacy": "dp_fedavg", "compression": "topk",
              "compression_options": {"density": 0.2}}
    hooks = [{"name": "dp_fedavg", "clip_norm": 1.0, "noise_multiplier": 0.3,
              "noise": "clients", "delta": 1e-3}]
    alone, pooled = (run_simulation(virtual_backend_config(workers, name, client=client,
                                                           hooks=hooks),
                                    tmp_path, progress=False)
                     for workers, name in ((0, "alone"), (2, "pooled")))
    updates = accepted_updates(alone.run_dir)
    assert len({client_id for client_id, _, _ in updates}) < len(updates)  # some train twice
    assert accepted_updates(pooled.run_dir) == updates
    assert pooled.summary["clients_with_kept_state"] == alone.summary["clients_with_kept_state"]
    np.testing.assert_allclose(np.load(pooled.run_dir / "model.npy"),
                               np.load(alone.run_dir / "model.npy"), atol=1e-6)


def test_a_negative_worker_count_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"virtual\.workers"):
        virtual_backend_config(-1, "bad")
