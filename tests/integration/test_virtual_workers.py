"""``[virtual] workers``: clients trained in worker processes give the run the loop alone gives.

A worker trains the same client from the same model with the same plan as the loop's process,
and the loop takes results in model-time order, so a run with a pool of worker processes must
accept the same updates in the same flushes and end at the same model as one without.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedlink.errors import ConfigError
from fedlink.sim.config import ExperimentConfig

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(240)


def _config(workers: int, name: str) -> ExperimentConfig:
    return ExperimentConfig.from_dict({
        "run": {"name": name, "seed": 5, "mode": "virtual"},
        "data": {"dataset": "digits", "clients": 12},
        "model": {"name": "mlp"},
        "network": {"fleet": {"3g": 0.5, "lan": 0.5}},
        "coordinator": {"rounds": 3, "flush": {"goal": 4, "over_selection": 1.5,
                                               "deadline_s": 30.0},
                        "training": {"local_epochs": 1, "batch_size": 16}},
        "virtual": {"workers": workers, "step_cost_s": 0.5},
    })


def _accepted(run_dir: Path) -> list[tuple[Any, ...]]:
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    return [(e["client_id"], e["task_id"], e["base_version"]) for e in events
            if e["kind"] == "update_accepted"]


def test_two_worker_processes_give_the_same_run_as_the_loop_alone(tmp_path: Path) -> None:
    from fedlink.sim import run_simulation

    alone = run_simulation(_config(0, "alone"), tmp_path, progress=False)
    pooled = run_simulation(_config(2, "pooled"), tmp_path, progress=False)
    assert len(_accepted(alone.run_dir)) >= 3 * 4
    assert alone.summary["training_processes"] == 1
    assert pooled.summary["training_processes"] == 2  # both workers trained clients
    assert _accepted(pooled.run_dir) == _accepted(alone.run_dir)
    np.testing.assert_allclose(np.load(pooled.run_dir / "model.npy"),
                               np.load(alone.run_dir / "model.npy"), atol=1e-6)
    assert pooled.summary["final_accuracy"] == pytest.approx(alone.summary["final_accuracy"])


def test_a_negative_worker_count_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"virtual\.workers"):
        _config(-1, "bad")
