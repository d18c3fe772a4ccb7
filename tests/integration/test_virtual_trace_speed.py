"""A device trace's ``speed`` column sets how long each traced client takes to train.

FedScale-style traces carry a device's compute capacity beside its availability; fedlink's trace
file takes it as an optional ``speed`` column (a compute-time multiplier) that replaces the
fleet's speed for the clients it names.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fedlink.errors import ConfigError
from fedlink.experiment.config import ExperimentConfig
from fedlink.sim.virtual.availability import TraceAvailability


def _run(tmp_path: Path, trace: str, name: str) -> dict[str, float]:
    from fedlink.sim import run_simulation

    path = tmp_path / f"{name}.csv"
    path.write_text(trace)
    config = ExperimentConfig.from_dict({
        "run": {"name": name, "seed": 4, "mode": "virtual"},
        "coordinator": {"rounds": 2, "flush": {"goal": 10, "deadline_s": 0},
                        "training": {"local_steps": 3}},
        "virtual": {"population": 10, "availability": "trace", "trace_file": str(path),
                    "deterministic": True, "step_cost_s": 1.0},
    })
    return run_simulation(config, tmp_path, progress=False).summary


def test_a_traced_speed_multiplies_each_clients_training_time(tmp_path: Path) -> None:
    always = "".join(f"{i},0,1e9\n" for i in range(10))
    plain = _run(tmp_path, "client,start_s,end_s\n" + always, "plain")
    slow = _run(tmp_path, "client,start_s,end_s,speed\n" +
                "".join(f"{i},0,1e9,3\n" for i in range(10)), "slow")
    assert plain["client_train_seconds"] == pytest.approx(2 * 10 * 3 * 1.0)
    assert slow["client_train_seconds"] == pytest.approx(3 * plain["client_train_seconds"])
    assert slow["model_seconds"] > plain["model_seconds"]


def test_speed_column_is_read_per_client_and_checked(tmp_path: Path) -> None:
    good = tmp_path / "good.csv"
    good.write_text("client,start_s,end_s,speed\n0,0,10,2.5\n0,20,30,2.5\n1,0,10,\n")
    trace = TraceAvailability.from_csv(good)
    assert trace.speeds == {0: 2.5}
    clash = tmp_path / "clash.csv"
    clash.write_text("client,start_s,end_s,speed\n0,0,10,2\n0,20,30,4\n")
    with pytest.raises(ConfigError, match="one speed"):
        TraceAvailability.from_csv(clash)
    zero = tmp_path / "zero.csv"
    zero.write_text("client,start_s,end_s,speed\n0,0,10,0\n")
    with pytest.raises(ConfigError, match="speed must be a number > 0"):
        TraceAvailability.from_csv(zero)
