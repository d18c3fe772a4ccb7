"""Federated evaluation: ``[coordinator.evaluation] fraction, every`` over real gRPC, through
``run_simulation`` (who is asked and when: ``tests/unit/test_evaluation_desk.py``)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
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
    assert ET.parse(result.run_dir / "client_accuracy.svg").getroot().tag.endswith("svg")
    assert (result.run_dir / "federated_vs_central.svg").is_file()


def test_holdout_needs_evaluation_and_a_share_below_one() -> None:
    with pytest.raises(ConfigError, match=r"holdout.*fraction"):
        ExperimentConfig.from_dict({"coordinator": {"evaluation": {"holdout": 0.2}}})
    with pytest.raises(ConfigError, match=r"coordinator\.evaluation\.holdout"):
        ExperimentConfig.from_dict({"coordinator": {"evaluation": {"fraction": 1.0,
                                                                   "holdout": 1.0}}})


@pytest.mark.timeout(180)
def test_clients_score_a_held_out_share_they_never_trained_on(tmp_path: Path) -> None:
    from fedlink.data import load_federated
    from fedlink.experiment.setup import Experiment, held_out_count, split_holdout

    config = ExperimentConfig.from_dict({
        "run": {"name": "held-out", "seed": 5},
        "data": {"dataset": "digits", "clients": 4, "partition": "iid"},
        "model": {"name": "mlp", "options": {"hidden": [32]}},
        "coordinator": {
            "rounds": 2,
            "flush": {"goal": 4, "deadline_s": 60.0},
            "training": {"local_epochs": 1, "batch_size": 32, "learning_rate": 0.1},
            "evaluation": {"fraction": 1.0, "every": 1, "holdout": 0.25},
        },
    })
    data = load_federated("digits", 4, 5, "iid")
    sizes = [len(c) for c in data.clients]
    held = [held_out_count(n, 0.25) for n in sizes]
    assert all(h == round(n / 4) for h, n in zip(held, sizes, strict=True))
    train, apart = split_holdout(data.clients[0], 0.25, seed=11)
    assert len(train) + len(apart) == sizes[0] and len(apart) == held[0]
    together = np.concatenate([train.x, apart.x])  # the two parts are the client's data
    assert np.array_equal(np.unique(together, axis=0), np.unique(data.clients[0].x, axis=0))
    result = run_simulation(config, tmp_path, progress=False)
    events = read_events(result.run_dir / "events.jsonl")
    scored = [e["num_examples"] for e in events if e["kind"] == "evaluation_reported"]
    trained = [e["num_examples"] for e in events if e["kind"] == "update_accepted"]
    assert scored and set(scored) <= set(held)  # each scored its held-out share only ...
    assert trained and set(trained) <= {n - h for n, h in zip(sizes, held, strict=True)}
    # ... and trained on the rest
    assert Experiment.build(config).client_examples(0) == sizes[0] - held[0]
    assert result.summary["config"]["coordinator"]["evaluation"]["holdout"] == 0.25
    assert "held-out 25%" in result.summary["federated_evaluation"]["scored_on"]


def test_evaluate_train_scores_only_the_data_clients_train_on(tmp_path: Path) -> None:
    """``[run] evaluate_train`` with a holdout: the pooled training set leaves out what each
    client keeps apart (it scored every client's whole data, held-out part included)."""
    from fedlink.experiment.setup import Experiment, split_holdout

    config = ExperimentConfig.from_dict({
        "run": {"name": "train-score", "seed": 5, "evaluate_train": True},
        "data": {"dataset": "digits", "clients": 4, "partition": "iid"},
        "coordinator": {"evaluation": {"fraction": 1.0, "holdout": 0.25}},
    })
    experiment = Experiment.build(config)
    trained = sum(experiment.client_examples(i) for i in range(4))
    train_x = experiment.evaluator()._train[0].cpu().numpy()  # type: ignore[attr-defined]
    assert len(train_x) == trained < sum(len(c) for c in experiment.data.clients)
    apart = split_holdout(experiment.data.clients[0], 0.25, experiment.client_seed(0))[1]
    rows = {row.tobytes() for row in train_x.astype(np.float32)}
    assert not any(row.astype(np.float32).tobytes() in rows for row in apart.x)
