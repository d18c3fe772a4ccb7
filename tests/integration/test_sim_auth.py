"""``fedlink simulate`` with an authenticated coordinator: its own clients get in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fedlink.errors import ConfigError
from fedlink.sim import ExperimentConfig, run_simulation

pytestmark = pytest.mark.timeout(120)


def tiny(name: str, **coordinator: Any) -> ExperimentConfig:
    return ExperimentConfig.from_dict({
        "run": {"name": name, "seed": 2},
        "data": {"dataset": "digits", "clients": 3},
        "model": {"name": "logreg"},
        "coordinator": {"rounds": 2, "flush": {"goal": 3},
                        "training": {"local_epochs": 1, "learning_rate": 0.5},
                        "limits": {"long_poll_s": 1.0}, **coordinator},
    })


def test_per_client_tokens_are_issued_to_simulated_clients(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDLINK_TEST_SECRET", "s" * 32)
    config = tiny("sim-auth", auth={"secret_env": "FEDLINK_TEST_SECRET"})
    result = run_simulation(config, tmp_path, progress=False)
    assert result.summary["rounds"] == 2
    assert result.summary["updates_accepted"] == 6


def test_the_shared_join_token_is_presented(tmp_path: Path) -> None:
    result = run_simulation(tiny("sim-join-token", join_token="let-me-in"), tmp_path,
                            progress=False)
    assert result.summary["rounds"] == 2


def test_tls_is_refused_with_a_reason(tmp_path: Path) -> None:
    config = tiny("sim-tls", tls={"cert_file": "server.pem", "key_file": "server.key"})
    with pytest.raises(ConfigError, match="plaintext"):
        run_simulation(config, tmp_path, progress=False)


def test_drain_s_is_refused_as_nothing_would_read_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="drain_s"):
        run_simulation(tiny("sim-drain", drain_s=30.0), tmp_path, progress=False)
    assert not (tmp_path / "sim-drain").exists()  # refused before the run folder is made
