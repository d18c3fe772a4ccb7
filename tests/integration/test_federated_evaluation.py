"""Federated evaluation: ``[coordinator.evaluation] fraction, every`` over real gRPC."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedlink.client import TrainPlan
from fedlink.client.evaluation import EVERY_OPTION, FRACTION_OPTION, evaluation_due
from fedlink.errors import ConfigError
from fedlink.metrics import read_events
from fedlink.sim import ExperimentConfig, run_simulation


def test_a_seeded_fraction_of_clients_evaluates_every_nth_version() -> None:
    options = {FRACTION_OPTION: "0.3", EVERY_OPTION: "2"}
    due = {(seed, version): evaluation_due(TrainPlan(options=options, model_version=version),
                                           seed)
           for seed in range(400) for version in range(4)}
    assert not any(d for (_, version), d in due.items() if version % 2)
    share = np.mean([d for (_, version), d in due.items() if version % 2 == 0])
    assert 0.22 < share < 0.38
    again = evaluation_due(TrainPlan(options=options, model_version=2), 7)
    assert again == due[(7, 2)]
    assert not evaluation_due(TrainPlan(model_version=2), 7)  # not asked


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
    assert curve["versions"] == [0, 2]
    events = read_events(result.run_dir / "events.jsonl")
    for version, accuracy, clients in zip(curve["versions"], curve["accuracy"],
                                          curve["clients"], strict=True):
        rows = [e["client_metrics"] for e in events if e["kind"] == "update_accepted"
                and e["base_version"] == version and "client_metrics" in e]
        assert 1 <= clients == len(rows) <= 6
        examples = np.array([r["fed_eval_examples"] for r in rows])
        expected = np.dot(examples, [r["fed_eval_accuracy"] for r in rows]) / examples.sum()
        assert accuracy == pytest.approx(expected)
    assert curve["accuracy"][1] > curve["accuracy"][0]  # the model learned between them
    assert len(curve["last_client_accuracies"]) == curve["clients"][-1]
    report = result.report.read_text()
    assert "## Federated evaluation" in report
    assert (result.run_dir / "client_accuracy.png").read_bytes().startswith(b"\x89PNG")
    assert (result.run_dir / "federated_vs_central.png").is_file()
