"""End to end: both DP examples train over real gRPC and report accuracy and epsilon."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fedlink.config import load_toml
from fedlink.metrics import read_events
from fedlink.sim import ExperimentConfig, run_simulation

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PRIVACY_KEYS = {"epsilon", "delta", "noise_multiplier", "sample_rate", "steps", "accountant",
                "clip_norm", "mode"}


def _example(name: str, rounds: int, **hook: Any) -> ExperimentConfig:
    table = load_toml(EXAMPLES / name)
    table["coordinator"]["rounds"] = rounds
    for entry in table["coordinator"].get("hooks", []):
        entry.update(hook)
    return ExperimentConfig.from_dict(table)


def _flush_epsilons(run_dir: Path) -> list[float]:
    events = read_events(run_dir / "events.jsonl")
    return [e["epsilon"] for e in events if e["kind"] == "flush"]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("noise", ["central", "clients"])
def test_user_level_example_trains_and_reports_epsilon(tmp_path: Path, noise: str) -> None:
    result = run_simulation(_example("digits_dp_user.toml", rounds=10, noise=noise),
                            tmp_path, progress=False)

    summary = json.loads((result.run_dir / "summary.json").read_text())
    privacy = summary["privacy"]
    assert set(privacy) >= PRIVACY_KEYS
    assert privacy["mode"] == f"user_{noise}" and privacy["steps"] == 10
    assert privacy["sample_rate"] == 0.5 and privacy["clip_norm"] == 1.0
    assert 0 < privacy["epsilon"] <= 30.0
    epsilons = _flush_epsilons(result.run_dir)
    assert len(epsilons) == 10 and epsilons == sorted(epsilons)
    assert epsilons[-1] == privacy["epsilon"]
    assert summary["final_accuracy"] >= 0.6, summary["final_accuracy"]
    report = (result.run_dir / "report.md").read_text()
    assert "Epsilon" in report and "user_" in report


@pytest.mark.timeout(180)
def test_user_level_run_stops_when_the_budget_is_spent(tmp_path: Path) -> None:
    result = run_simulation(_example("digits_dp_user.toml", rounds=30, max_epsilon=8.0),
                            tmp_path, progress=False)

    summary = result.summary
    assert summary["rounds"] < 30
    assert "privacy budget exhausted" in summary["finish_reason"]
    assert summary["privacy"]["epsilon"] <= 8.0
    assert summary["privacy"]["steps"] == summary["rounds"]
    events = read_events(result.run_dir / "events.jsonl")
    finished = [e for e in events if e["kind"] == "run_finished"]
    assert finished and "privacy budget exhausted" in finished[-1]["reason"]


@pytest.mark.timeout(180)
def test_dp_sgd_example_trains_and_reports_client_epsilon(tmp_path: Path) -> None:
    result = run_simulation(_example("digits_dp_sgd.toml", rounds=4), tmp_path, progress=False)

    summary = result.summary
    privacy = summary["privacy"]
    assert set(privacy) >= PRIVACY_KEYS
    assert privacy["mode"] == "sample_dp_sgd" and privacy["noise_multiplier"] == 1.0
    assert privacy["clip_norm"] == 1.0 and privacy["delta"] == 1e-5
    assert 0 < privacy["epsilon"] < 20
    events = read_events(result.run_dir / "events.jsonl")
    accepted = [e for e in events if e["kind"] == "update_accepted"]
    reported = [e["client_metrics"]["dp_epsilon"] for e in accepted]
    assert len(reported) == 40 and max(reported) == pytest.approx(privacy["epsilon"])
    assert len(_flush_epsilons(result.run_dir)) == 4
    assert summary["final_accuracy"] >= 0.3, summary["final_accuracy"]


@pytest.mark.timeout(180)
def test_adaptive_clip_norm_reaches_clients_and_tracks_the_quantile(tmp_path: Path) -> None:
    """Andrew et al.: S moves toward the target quantile of update norms, and clients clip
    to the S their task carries (they report it back as ``dp_clip_norm``)."""
    table = load_toml(EXAMPLES / "digits_dp_user.toml")
    table["run"]["name"] = "adaptive"
    table["data"]["clients"] = 20
    table["coordinator"]["rounds"] = 6
    table["coordinator"]["flush"].update(goal=10, min_updates=10)
    hook = table["coordinator"]["hooks"][0]
    hook.update(clip_norm=50.0, target_quantile=0.5, clip_learning_rate=0.5,
                max_epsilon=1000.0)
    config = ExperimentConfig.from_dict(table)

    result = run_simulation(config, tmp_path, progress=False)

    events = read_events(result.run_dir / "events.jsonl")
    norms = [e["privacy"]["clip_norm"] for e in events if e["kind"] == "flush"]
    assert norms[-1] < norms[0] < 50.0  # S = 50 clips nothing: it must shrink
    reported = [e["client_metrics"]["dp_clip_norm"] for e in events
                if e["kind"] == "update_accepted" and e["base_version"] == 5]
    assert reported and all(abs(r - norms[4]) < 1e-9 for r in reported)
