"""End to end: a digits FedAvg run over real gRPC on loopback reaches its target accuracy."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from fedlink.metrics import read_events
from fedlink.sim import ExperimentConfig, run_simulation


def _config(rounds: int) -> ExperimentConfig:
    return ExperimentConfig.from_dict({
        "run": {"name": "it-digits", "seed": 7},
        "data": {"dataset": "digits", "clients": 10, "partition": "iid"},
        "model": {"name": "mlp"},
        "coordinator": {
            "rounds": rounds,
            "flush": {"goal": 10, "min_updates": 10, "deadline_s": 60.0},
            "training": {"local_epochs": 3, "batch_size": 32, "learning_rate": 0.2},
        },
    })


@pytest.mark.timeout(120)
def test_ten_clients_reach_90_percent_within_20_rounds(tmp_path: Path) -> None:
    result = run_simulation(_config(rounds=20), tmp_path, progress=False)

    events = read_events(result.run_dir / "events.jsonl")
    accuracies = [e["accuracy"] for e in events if e["kind"] == "flush"]
    assert len(accuracies) == 20
    assert max(accuracies) >= 0.90, accuracies
    assert result.summary["final_accuracy"] >= 0.90
    assert result.summary["updates_accepted"] == 200
    assert result.summary["updates_refused"] == 0


@pytest.mark.timeout(120)
def test_run_folder_holds_events_summary_and_report(tmp_path: Path) -> None:
    result = run_simulation(_config(rounds=2), tmp_path, progress=False)

    run_dir = tmp_path / "it-digits"
    summary = json.loads((run_dir / "summary.json").read_text())
    for key in ("final_accuracy", "rounds", "wall_seconds", "bytes_up", "bytes_down",
                "updates_accepted", "updates_refused", "config"):
        assert key in summary, key
    assert summary["rounds"] == 2
    assert summary["config"]["data"]["clients"] == 10
    # 10 clients x 2 rounds, each uploading and downloading one fp32 model
    num_params = 64 * 64 + 64 + 64 * 64 + 64 + 64 * 10 + 10
    assert summary["bytes_up"] == 20 * 4 * num_params
    # downloads after the first round are exact deltas from the version a client holds
    assert summary["delta_bytes_saved"] > 0
    assert summary["bytes_down"] + summary["delta_bytes_saved"] == 20 * 4 * num_params
    report = (run_dir / "report.md").read_text()
    assert "accuracy_vs_round.svg" in report and "accuracy_vs_time.svg" in report
    assert ET.parse(run_dir / "accuracy_vs_round.svg").getroot().tag.endswith("svg")
    assert result.report == run_dir / "report.md"
