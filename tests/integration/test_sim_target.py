"""A simulation with a target accuracy ends the run at the first flush that reaches it."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedlink.metrics import read_events
from fedlink.sim import ExperimentConfig, run_simulation


@pytest.mark.timeout(120)
@pytest.mark.parametrize("preset", ["sync", "async"])
def test_run_stops_once_the_target_accuracy_is_reached(tmp_path: Path, preset: str) -> None:
    config = ExperimentConfig.from_dict({
        "run": {"name": f"target-{preset}", "seed": 1, "target_accuracy": 0.6},
        "data": {"dataset": "digits", "clients": 8},
        "model": {"name": "logreg"},
        "coordinator": {
            "rounds": 200,
            "flush": {"preset": preset, "goal": 4},
            "training": {"local_epochs": 1, "learning_rate": 0.5},
            "limits": {"long_poll_s": 1.0},
        },
    })

    result = run_simulation(config, tmp_path, progress=False)

    events = read_events(result.run_dir / "events.jsonl")
    finished = [e for e in events if e["kind"] == "run_finished"]
    assert len(finished) == 1
    assert finished[0]["reason"] == "reached the target accuracy 0.6"
    flushes = [e for e in events if e["kind"] == "flush"]
    reached = [e["accuracy"] >= 0.6 for e in flushes]
    assert reached == [False] * (len(flushes) - 1) + [True]  # ends on the first to reach it
    assert len(flushes) < 200
    # every flush the engine made before the end was reported before run_finished
    assert flushes[-1]["model_version"] == finished[0]["model_version"]
