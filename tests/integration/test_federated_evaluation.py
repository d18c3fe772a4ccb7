"""Federated evaluation: ``[coordinator.evaluation] fraction, every`` over real gRPC, through
``run_simulation`` (who is asked and when: ``tests/unit/test_evaluation_desk.py``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedlink.errors import ConfigError
from fedlink.metrics import read_events
from fedlink.sim import ExperimentConfig, run_simulation


def test_bad_evaluation_settings_fail_at_load() -> None:
    with pytest.raises(ConfigError, match=r"coordinator\.evaluation\.fraction"):
        ExperimentConfig.from_dict({"coordinator": {"evaluation": {"fraction": 1.5}}})
    with pytest.raises(ConfigError, match=r"coordinator\.evaluation\.every"):
        ExperimentConfig.from_dict({"coordinator": {"evaluation": {"fraction": 0.5,
                                                                   "every": 0}}})


@pytest.mark.timeout(180)
def test_federated_curve_is_example_weighted_and_reported(tmp_path: Path) -> None:
    config = ExperimentConfig.from_dict({
        "run": {"name": "fed-eval", "seed": 2},
        "data": {"dataset": "digits", "clients": 6, "partition": "dirichlet",
                 "options": {"alpha": 0.3}},
        "model": {"name": "mlp", "options": {"hidden": [32]}},
        "coordinator": {
            "rounds": 4,
            "flush": {"goal": 6, "deadline_s": 60.0},
            "training": {"local_epochs": 1, "batch_size": 32, "learning_rate": 0.1},
            "evaluation": {"fraction": 0.6, "every": 2},
        },
    })
    result = run_simulation(config, tmp_path, progress=False)
    curve = result.summary["federated_evaluation"]
    # every 2nd version, and the final one (4) scored at the run's end
    assert curve["versions"] == [0, 2, 4]
    assert result.summary["final_federated_accuracy"] == curve["accuracy"][-1]
    # the same number of clients each version: 60% of 6, rounded (version 0's are drawn
    # among the clients joined at its first check-in)
    assert curve["clients"][1:] == [4, 4] and 1 <= curve["clients"][0] <= 4
    events = read_events(result.run_dir / "events.jsonl")
    for version, accuracy, clients in zip(curve["versions"], curve["accuracy"],
                                          curve["clients"], strict=True):
        rows = [e for e in events if e["kind"] == "evaluation_reported"
                and e["model_version"] == version]
        assert 1 <= clients == len(rows) <= 6
        examples = np.array([r["num_examples"] for r in rows])
        expected = np.dot(examples, [r["accuracy"] for r in rows]) / examples.sum()
        assert accuracy == pytest.approx(expected)
    assert curve["accuracy"][1] > curve["accuracy"][0]  # the model learned between them
    assert len(curve["last_client_accuracies"]) == curve["clients"][-1]
    report = result.report.read_text()
    assert "## Federated evaluation" in report
    assert (result.run_dir / "client_accuracy.png").read_bytes().startswith(b"\x89PNG")
    assert (result.run_dir / "federated_vs_central.png").is_file()
