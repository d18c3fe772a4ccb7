"""``[coordinator.evaluation]`` in virtual-clock mode: evaluation tasks as timed events, drawn
from the whole population (not only the cohort), reproducible with the seed, and in the
summary and report like a real run's."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedlink.metrics import read_events
from fedlink.sim import ExperimentConfig, run_simulation

pytestmark = pytest.mark.timeout(120)

POPULATION = 400


def _config(name: str, fraction: float = 0.05, delta_history: int = 4) -> ExperimentConfig:
    return ExperimentConfig.from_dict({
        "run": {"name": name, "seed": 4, "mode": "virtual"},
        "virtual": {"population": POPULATION, "step_cost_s": 0.05},
        "coordinator": {"rounds": 4, "flush": {"goal": 10, "deadline_s": 600.0},
                        "training": {"local_epochs": 1, "batch_size": 16,
                                     "learning_rate": 0.1},
                        "limits": {"delta_history": delta_history},
                        "evaluation": {"fraction": fraction, "every": 2} if fraction else {}},
        "network": {"fleet": {"3g": 0.5, "4g": 0.5}},
    })


def _reports(run_dir: Path) -> list[dict[str, Any]]:
    return [dict(e) for e in read_events(run_dir / "events.jsonl")
            if e["kind"] == "evaluation_reported"]


def _without_wall_time(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k != "t"} for row in rows]


def test_virtual_evaluation_tasks_reach_beyond_the_cohort_and_are_reported(
        tmp_path: Path) -> None:
    result = run_simulation(_config("virtual-eval"), tmp_path, progress=False)
    events = read_events(result.run_dir / "events.jsonl")
    reports = _reports(result.run_dir)
    curve = result.summary["federated_evaluation"]
    # every 2nd version, and the final one (4) whatever `every` says, each by the same
    # number of clients: 5% of 400
    assert curve["versions"] == [0, 2, 4]
    assert curve["clients"] == [20, 20, 20]
    assert result.summary["final_federated_accuracy"] == curve["accuracy"][-1]
    trained = {e["client_id"] for e in events if e["kind"] == "task_issued"}
    assert {r["client_id"] for r in reports} - trained  # clients outside every cohort
    for version, accuracy, clients in zip(curve["versions"], curve["accuracy"],
                                          curve["clients"], strict=True):
        rows = [r for r in reports if r["model_version"] == version]
        assert clients == len(rows) and 5 <= clients <= 40  # about 5% of 400
        weights = np.array([r["num_examples"] for r in rows], dtype=float)
        expected = weights @ np.array([r["accuracy"] for r in rows]) / weights.sum()
        assert accuracy == pytest.approx(float(expected))
    assert curve["accuracy"][1] > curve["accuracy"][0]  # the model learned between them
    # reports arrive in model time: after their version was published
    published = {0: 0.0, **{int(e["model_version"]): float(e["model_seconds"])
                            for e in events if e["kind"] == "flush"}}
    issued = {e["task_id"]: e for e in events if e["kind"] == "evaluation_issued"}
    assert set(issued) >= {r["task_id"] for r in reports}
    assert all(float(e["elapsed"]) >= published[int(e["model_version"])]  # model time
               for e in issued.values())
    assert "## Federated evaluation" in result.report.read_text()
    assert ET.parse(result.run_dir / "client_accuracy.svg").getroot().tag.endswith("svg")
    again = run_simulation(_config("virtual-eval-again"), tmp_path, progress=False)
    assert _without_wall_time(_reports(again.run_dir)) == _without_wall_time(reports)


def _accepted(run_dir: Path) -> list[tuple[Any, ...]]:
    return [(e["client_id"], e["task_id"], e["base_version"], e["elapsed"])
            for e in read_events(run_dir / "events.jsonl") if e["kind"] == "update_accepted"]


def test_evaluation_tasks_leave_training_as_it_was(tmp_path: Path) -> None:
    """They take no place and draw on their own random streams: the same updates arrive at
    the same model times, and the run ends at the same model. (With delta downloads a client
    that evaluated a recent version downloads a smaller delta for its next training task, as
    a real client does, and arrives earlier: the comparison turns them off.)"""
    off = run_simulation(_config("virtual-no-eval", fraction=0.0, delta_history=0), tmp_path,
                         progress=False)
    assert _reports(off.run_dir) == [] and "federated_evaluation" not in off.summary
    on = run_simulation(_config("virtual-with-eval", delta_history=0), tmp_path,
                        progress=False)
    assert _reports(on.run_dir)
    assert _accepted(on.run_dir) == _accepted(off.run_dir)
    np.testing.assert_array_equal(np.load(on.run_dir / "model.npy"),
                                  np.load(off.run_dir / "model.npy"))
