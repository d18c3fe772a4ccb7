"""A virtual run whose fleet can no longer make a version ends, saying why, instead of
polling for ever; a client that is only away for a while is waited for.

A served coordinator waits for clients that may yet come; a simulation's population is all
there is, and its availability says who comes back: once nothing is scheduled, no task holds
a place, no deadline would flush and every client is busy, told to wait or gone for good,
the run has stalled.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fedlink.experiment.config import ExperimentConfig
from fedlink.sim.virtual.runner import run_virtual

pytestmark = pytest.mark.timeout(120)


def _run(tmp_path: Path, name: str, trace: str, secure: bool = False,
         **flush: Any) -> dict[str, Any]:
    """3 clients of digits, groups (or rounds) of 3; client 2 online as ``trace`` says."""
    path = tmp_path / f"{name}.csv"
    path.write_text("client,start_s,end_s\n" + trace)
    coordinator: dict[str, Any] = {
        "rounds": 3, "norm_bound": 0, "norm_bound_adaptive": False,
        "robust": {"enabled": False},
        "flush": {"goal": 3, "deadline_s": 40.0, "max_staleness": 0, **flush},
        "training": {"local_epochs": 1, "batch_size": 32, "learning_rate": 0.2}}
    if secure:
        coordinator["secure"] = {"enabled": True, "phase_s": 2.0}
    config = ExperimentConfig.from_dict({
        "run": {"name": name, "seed": 0, "mode": "virtual"},
        "data": {"dataset": "digits", "clients": 3},
        "model": {"name": "mlp", "options": {"hidden": [16]}},
        "coordinator": coordinator,
        "virtual": {"availability": "trace", "trace_file": str(path)},
    })
    return run_virtual(config, tmp_path, progress=False, report=False).summary


GONE_FOR_GOOD = "2,0,0.05\n"
"""Client 2 leaves during its first download and never comes back."""


def test_a_round_no_client_left_can_fill_ends_the_run_stalled(tmp_path: Path) -> None:
    """Every round needs all 3 updates and one client is gone for good: the other two have
    answered for version 0 and are told to wait. Before, the run polled for ever."""
    summary = _run(tmp_path, "plain", GONE_FOR_GOOD, min_updates=3)
    assert summary["finish_reason"].startswith(
        "stalled at version 0: no client left can take or finish a task (1 of 3 clients "
        "offline for good")
    assert summary["rounds"] == 0 and summary["updates_accepted"] == 2
    assert "the run ended before its rounds were done, stalled" in summary["warning"]


def test_a_client_away_for_a_while_is_waited_for(tmp_path: Path) -> None:
    """The same fleet, but client 2 comes back an hour later: the run waits for it and
    completes its rounds."""
    summary = _run(tmp_path, "back", GONE_FOR_GOOD + "2,3600,1e9\n", min_updates=3)
    assert summary["finish_reason"] == "completed 3 rounds"
    assert summary["model_seconds"] > 3600
    assert summary["warning"] is None


def test_a_secure_group_too_small_to_go_on_waits_and_the_run_ends_stalled(
        tmp_path: Path) -> None:
    """Client 2 shared its keys in group 1 and left: with 2 neighbours each, its neighbours'
    self-mask seeds cannot be rebuilt, and group 1 is lost. Two clients are left for the next
    group of 3: a roster too small to go on (each member shares its secrets among at least 2
    others). Before, that group was lost at every roster deadline and its members formed it
    again with fresh keys, for ever: 15,000 groups lost in 20 s of wall time. Now the roster
    waits for a third member, and the run, whose fleet has none to give, ends stalled,
    naming the group."""
    pytest.importorskip("cryptography")
    summary = _run(tmp_path, "secure", GONE_FOR_GOOD, secure=True, min_updates=2)
    assert summary["finish_reason"].startswith("stalled at version 0")
    assert "secure group 2 waits for members: 2 advertised keys, 3 needed" in (
        summary["finish_reason"])
    assert summary["secure_groups_lost"] == 1
