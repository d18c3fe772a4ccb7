"""Communication share: clients report compute and network seconds per task; the summary
carries ``comm_share`` and the report shows it per round and per link profile."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedlink.metrics import read_events
from fedlink.sim import ExperimentConfig, run_simulation


def _config(preset: str) -> ExperimentConfig:
    return ExperimentConfig.from_dict({
        "run": {"name": f"share-{preset}", "seed": 5},
        "data": {"dataset": "digits", "clients": 4},
        "model": {"name": "mlp", "options": {"hidden": [64]}},
        "coordinator": {
            "rounds": 2,
            "flush": {"goal": 4, "min_updates": 4, "deadline_s": 60.0},
            "training": {"local_steps": 5, "learning_rate": 0.3},
        },
        "network": {"preset": preset},
    })


@pytest.mark.timeout(180)
def test_comm_share_is_larger_on_3g_than_on_lan(tmp_path: Path) -> None:
    lan = run_simulation(_config("lan"), tmp_path / "lan", progress=False)
    slow = run_simulation(_config("3g"), tmp_path / "3g", progress=False)

    for result in (lan, slow):
        summary = result.summary
        assert summary["updates_accepted"] == 8
        assert summary["network_seconds"] > 0 and summary["compute_seconds"] > 0
        assert summary["comm_share"] == pytest.approx(
            summary["network_seconds"]
            / (summary["network_seconds"] + summary["compute_seconds"]))
        accepted = [e for e in read_events(result.run_dir / "events.jsonl")
                    if e["kind"] == "update_accepted"]
        assert all(e["network_seconds"] > 0 and e["train_seconds"] > 0 for e in accepted)
    # the same model and training over a 200 ms RTT, 750 kbit/s uplink: most of a task
    # is waiting on the network
    assert slow.summary["comm_share"] > lan.summary["comm_share"]
    row = slow.summary["network"]["profiles"]["3g"]
    assert row["comm_share"] > lan.summary["network"]["profiles"]["lan"]["comm_share"]
    report = (slow.run_dir / "report.md").read_text()
    assert "Comm share" in report
    assert "packet-only settings were not applied: 3g (loss_up, loss_down)" in report
