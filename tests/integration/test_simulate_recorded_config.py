"""A simulation's ``summary.json`` records the coordinator config that ran, not the one loaded:
a real-gRPC simulation raises the per-connection limits for its one-address population (and
turns on pace steering for a large one), and both modes seed a ``dp_fedavg`` hook's noise
from the run's seed. Over gRPC that is what ``run_started`` carries."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from fedlink.metrics import read_events
from fedlink.privacy.setup import with_run_seed
from fedlink.sim import ExperimentConfig, run_simulation
from fedlink.sim.capacity import PACED_FROM_CLIENTS, SIM_CHECKINS_PER_S
from fedlink.sim.runner import coordinator_config, recorded_config

HOOK = {"name": "dp_fedavg", "clip_norm": 1.0, "noise_multiplier": 0.8, "delta": 1e-3}


def _table(mode: str, seed: int) -> dict[str, Any]:
    return {
        "run": {"name": f"recorded-{mode}", "seed": seed, "mode": mode},
        "data": {"dataset": "digits", "clients": 4},
        "model": {"name": "logreg"},
        "client": {"privacy": "dp_fedavg"},
        "coordinator": {"rounds": 2, "flush": {"goal": 4, "min_updates": 4},
                        "training": {"local_steps": 2, "learning_rate": 0.5},
                        "hooks": [HOOK]},
    }


@pytest.mark.timeout(120)
def test_grpc_summary_records_the_coordinator_config_that_ran(tmp_path: Path) -> None:
    config = ExperimentConfig.from_dict(_table("grpc", seed=3))
    result = run_simulation(config, tmp_path, progress=False, report=False)

    recorded = json.loads((result.run_dir / "summary.json").read_text())["config"]
    started = [e for e in read_events(result.run_dir / "events.jsonl")
               if e["kind"] == "run_started"]
    assert len(started) == 1
    assert recorded["coordinator"] == started[0]["config"]
    # the adjustments themselves: raised for 4 clients on one connection, noise seeded
    loaded = config.coordinator
    assert recorded["coordinator"]["limits"]["max_streams_per_connection"] \
        > loaded.limits.max_streams_per_connection
    assert "seed" not in loaded.hooks[0]
    assert recorded["coordinator"]["hooks"][0]["seed"] == 3
    # the rest is the experiment's config as loaded
    assert recorded["data"]["clients"] == 4 and recorded["run"]["seed"] == 3


@pytest.mark.timeout(120)
def test_virtual_summary_records_the_coordinator_config_that_ran(tmp_path: Path) -> None:
    config = ExperimentConfig.from_dict(_table("virtual", seed=5))
    result = run_simulation(config, tmp_path, progress=False, report=False)

    recorded = json.loads((result.run_dir / "summary.json").read_text())["config"]
    assert recorded["coordinator"]["hooks"][0]["seed"] == 5
    assert recorded["coordinator"] == json.loads(json.dumps(
        with_run_seed(config.coordinator).to_dict()))


def test_pace_steering_of_a_large_population_is_recorded() -> None:
    config = ExperimentConfig.from_dict({"data": {"dataset": "digits", "clients": 4}})
    assert not config.coordinator.limits.checkins_per_s
    experiment: Any = SimpleNamespace(
        config=config, data=SimpleNamespace(num_clients=PACED_FROM_CLIENTS))
    ran = coordinator_config(experiment)
    assert ran.limits.checkins_per_s == SIM_CHECKINS_PER_S
    recorded = recorded_config(config.to_dict(), ran)
    assert recorded["coordinator"]["limits"]["checkins_per_s"] == SIM_CHECKINS_PER_S
    assert recorded["coordinator"]["limits"]["max_clients"] >= PACED_FROM_CLIENTS
    assert {k: v for k, v in recorded.items() if k != "coordinator"} == \
        {k: v for k, v in config.to_dict().items() if k != "coordinator"}
