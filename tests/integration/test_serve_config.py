"""What ``fedlink serve`` makes of an experiment file: it ends a run at ``[run]
target_accuracy``, as a simulation does (it served every ``[coordinator] rounds`` whatever the
accuracy); it refuses a virtual-mode file and says which simulation sections it ignores."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from conftest import run_async, wait_until

from fedlink.cli.serve import _check_servable, _serve
from fedlink.client import ClientOptions, ClientSession, RetryPolicy
from fedlink.coordinator.faults import NO_FAULTS
from fedlink.errors import ConfigError
from fedlink.experiment.config import ExperimentConfig
from fedlink.experiment.setup import Experiment

CONFIG = """
[run]
name = "serve-target"
seed = 1
target_accuracy = 0.05   # reached by the first version: the digits have ten classes

[data]
dataset = "digits"
clients = 3

[model]
name = "logreg"

[coordinator]
rounds = 50

[coordinator.flush]
goal = 3
deadline_s = 0.0

[coordinator.training]
local_epochs = 1
"""


def _port(run_dir: Path) -> int | None:
    """The port ``run_started`` says the coordinator serves on, once it is logged."""
    path = run_dir / "events.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    started = [json.loads(line) for line in lines if '"run_started"' in line]
    return int(started[0]["port"]) if started else None


@pytest.mark.timeout(120)
def test_serve_ends_the_run_at_its_target_accuracy(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text(CONFIG)
    experiment = Experiment.build(ExperimentConfig.from_toml(path))
    run_dir = tmp_path / "runs" / "serve-target"

    async def main() -> int:
        serving = asyncio.create_task(_serve(path, "127.0.0.1:0", tmp_path / "runs", None,
                                             None, None, NO_FAULTS, asyncio.Event()))
        await wait_until(lambda: _port(run_dir) is not None, timeout=60, what="run_started")
        retry = RetryPolicy(initial_backoff_s=0.01, max_backoff_s=0.1, max_attempts=5)
        sessions = [ClientSession(f"127.0.0.1:{_port(run_dir)}", experiment.trainer(i),
                                  ClientOptions(name=f"c{i}", retry=retry)) for i in range(3)]
        await asyncio.gather(*(s.run() for s in sessions))
        return await serving

    assert run_async(main(), timeout=110) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert "target accuracy" in summary["finish_reason"], summary["finish_reason"]
    assert summary["rounds"] < 50 and summary["final_accuracy"] >= 0.05


def test_serve_refuses_a_virtual_run_and_says_what_simulation_sections_it_ignores(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match=r"^run\.mode: 'virtual' .* fedlink simulate"):
        _check_servable(ExperimentConfig.from_dict({"run": {"mode": "virtual"}}))
    _check_servable(ExperimentConfig.from_dict({
        "network": {"preset": "3g"}, "partial_work": {"fraction": 0.5},
        "coordinator": {"training": {"local_epochs": 2}}}))
    said = capsys.readouterr().err
    assert "[network] and [partial_work] shape a simulation's clients and are not applied" in said
    _check_servable(ExperimentConfig.from_dict({"run": {"device_step_s": 0.05}}))
    said = capsys.readouterr().err
    assert "[run] device_step_s shapes a simulation's clients and is not applied" in said
    _check_servable(ExperimentConfig.from_dict({}))
    assert capsys.readouterr().err == ""
