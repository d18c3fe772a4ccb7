"""Defaults that learn, and a warning when a run ends near chance.

A minimal config (dataset, clients, model name; everything else default) used to end at 0.09
on the digits, chance, in both modes and without a hint: one epoch of batches of 32 over a
client's 29 examples is one SGD step a round.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fedlink.metrics.formatting import key_figures
from fedlink.sim import ExperimentConfig, run_simulation

MINIMAL = {"data": {"dataset": "digits", "clients": 50}, "model": {"name": "mlp"}}


@pytest.mark.timeout(300)
def test_a_minimal_config_learns_the_digits_with_default_settings(tmp_path: Path) -> None:
    config = ExperimentConfig.from_dict({**MINIMAL, "run": {"mode": "virtual"}})
    assert config.coordinator.rounds == 10  # the default rounds, nothing tuned
    summary = run_simulation(config, tmp_path, progress=False).summary
    assert summary["rounds"] == 10
    assert summary["final_accuracy"] >= 0.85, summary["final_accuracy"]
    assert summary["warning"] is None


@pytest.mark.timeout(300)
def test_a_run_that_ends_near_chance_says_so(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    config = ExperimentConfig.from_dict({
        **MINIMAL, "run": {"name": "chance"},
        "coordinator": {"rounds": 2, "flush": {"goal": 10},
                        "training": {"local_steps": 1, "learning_rate": 1e-6}}})
    result = run_simulation(config, tmp_path, progress=False)
    warning = result.summary["warning"]
    assert warning and "near chance" in warning and "10 classes" in warning
    assert "near chance" in capsys.readouterr().err
    assert ("WARNING", warning) in key_figures(result.summary)
    assert "near chance" in result.report.read_text()
