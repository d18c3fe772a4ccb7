"""``fedlink simulate FILE`` finds the user's modules beside FILE (its folder goes on sys.path),
from whatever directory it was started."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from fedlink.cli import main

MODULE = '''
"""A user's model, beside the experiment file."""
from torch import nn


def tiny(num_features: int = 64, num_classes: int = 10) -> nn.Module:
    return nn.Linear(num_features, num_classes)
'''

CONFIG = '''
[run]
name = "beside"
mode = "virtual"
[data]
dataset = "digits"
clients = 2
[model]
factory = "fedlink_user_model_beside:tiny"
[coordinator]
rounds = 1
[coordinator.flush]
goal = 2
'''


@pytest.mark.timeout(180)
def test_simulate_imports_modules_beside_the_config(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    (project / "fedlink_user_model_beside.py").write_text(textwrap.dedent(MODULE))
    (project / "experiment.toml").write_text(CONFIG)
    monkeypatch.chdir(elsewhere)  # not the config's folder
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(project))])
    monkeypatch.delitem(sys.modules, "fedlink_user_model_beside", raising=False)
    code = main(["simulate", str(project / "experiment.toml"), "--no-progress",
                 "--output-dir", str(tmp_path / "runs")])
    assert code == 0
    assert sys.path[0] == str(project.resolve())
    summary = json.loads((tmp_path / "runs" / "beside" / "summary.json").read_text())
    assert summary["config"]["model"]["factory"] == "fedlink_user_model_beside:tiny"
    assert summary["rounds"] == 1
