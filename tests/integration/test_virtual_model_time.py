"""A virtual-clock run's report: accuracy against model time and wall time, and where the
fleet's model time went (communication vs compute), per round and per link profile."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from fedlink.experiment.config import ExperimentConfig

pytestmark = pytest.mark.xdist_group("virtual-model-time")

SVG_ROOT = "{http://www.w3.org/2000/svg}svg"
ROUNDS = 3


def _virtual_run(tmp_path: Path) -> Path:
    """Synchronous FedAvg over 40 lazy clients on two link profiles, always online."""
    from fedlink.sim import run_simulation

    config = ExperimentConfig.from_dict({
        "run": {"name": "model-time", "seed": 3, "mode": "virtual"},
        "coordinator": {"rounds": ROUNDS, "flush": {"goal": 8, "deadline_s": 0},
                        "training": {"local_steps": 4}},
        "virtual": {"population": 40, "step_cost_s": 2.0},
        "network": {"fleet": {"3g": 0.5, "edge-2g": 0.5}},
    })
    return run_simulation(config, tmp_path, progress=False).run_dir


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _virtual_run(tmp_path_factory.mktemp("virtual"))


def _events(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def _task_model_seconds(events: list[dict[str, Any]]) -> dict[int, float]:
    """Per base model version, the model time the accepted tasks took, issue to commit
    (every client is always online, so that is all network and compute)."""
    issued = {e["task_id"]: e["elapsed"] for e in events if e["kind"] == "task_issued"}
    spent: dict[int, float] = defaultdict(float)
    for event in events:
        if event["kind"] == "update_accepted":
            spent[event["base_version"]] += event["elapsed"] - issued[event["task_id"]]
    return dict(spent)


def test_shares_per_round_and_per_profile_add_up_to_the_tasks_model_time(run_dir: Path) -> None:
    summary = json.loads((run_dir / "summary.json").read_text())
    events = _events(run_dir)
    rounds, profiles = summary["time_by_round"], summary["time_by_profile"]
    assert [r["round"] for r in rounds] == list(range(1, ROUNDS + 1))  # synchronous: no leftovers
    assert set(profiles) == {"3g", "edge-2g"}
    spent = _task_model_seconds(events)
    for row in rounds:
        assert row["network_s"] + row["compute_s"] == pytest.approx(spent[row["model_version"]])
        assert row["compute_s"] == pytest.approx(row["tasks"] * 4 * 2.0)  # steps x step cost
        assert row["comm_share"] == pytest.approx(
            row["network_s"] / (row["network_s"] + row["compute_s"]))
        assert 0 < row["comm_share"] < 1
    for table in (rounds, list(profiles.values())):
        assert sum(r["network_s"] for r in table) == pytest.approx(
            summary["client_network_seconds"])
        assert sum(r["compute_s"] for r in table) == pytest.approx(
            summary["client_train_seconds"])
        assert sum(r["tasks"] for r in table) == summary["tasks_issued"]
    # each accepted update reports its own task's model time, as a real client reports its own
    accepted = [e for e in events if e["kind"] == "update_accepted"]
    assert sum(e["train_seconds"] + e["network_seconds"] for e in accepted) == pytest.approx(
        sum(spent.values()))
    assert summary["comm_share"] == pytest.approx(summary["communication_share"])


def test_accuracy_is_carried_against_model_time_and_wall_time(run_dir: Path) -> None:
    summary = json.loads((run_dir / "summary.json").read_text())
    curve = summary["accuracy_by_time"]
    assert curve["model_version"] == list(range(1, ROUNDS + 1))
    assert all(a is not None for a in curve["accuracy"])
    assert curve["model_seconds"] == sorted(curve["model_seconds"])
    assert curve["model_seconds"][-1] <= summary["model_seconds"]
    assert curve["simulation_seconds"] == sorted(curve["simulation_seconds"])
    assert curve["simulation_seconds"][-1] <= summary["simulation_seconds"]


def test_report_shows_model_time_plots_and_share_tables(run_dir: Path) -> None:
    text = (run_dir / "report.md").read_text()
    assert "## Model time" in text
    for plot in ("accuracy_vs_model_time.svg", "accuracy_vs_simulation_time.svg",
                 "comm_vs_compute.svg"):
        assert ET.parse(run_dir / plot).getroot().tag == SVG_ROOT
        assert f"]({plot})" in text
    assert "Per round (model time" in text and "Per link profile (model time" in text
    assert "| edge-2g |" in text and "| 3g |" in text


def test_the_tables_add_up_with_evaluation_tasks_whose_network_time_they_hold(
        tmp_path: Path) -> None:
    """Federated evaluation on: an evaluation task's network time is in the totals, its
    client's profile and the evaluated version's round (before, in the totals alone, so
    neither table added up), and the tables' ``tasks`` still count training tasks."""
    from fedlink.sim import run_simulation

    config = ExperimentConfig.from_dict({
        "run": {"name": "model-time-eval", "seed": 3, "mode": "virtual"},
        "data": {"dataset": "digits", "clients": 4},
        "coordinator": {"rounds": 2, "flush": {"goal": 4, "min_updates": 4},
                        "evaluation": {"fraction": 1.0}},
        "network": {"preset": "4g"},
        "virtual": {"deterministic": True},
    })
    result = run_simulation(config, tmp_path, progress=False, report=False)
    summary = result.summary
    assert any(e["kind"] == "evaluation_reported" for e in _events(result.run_dir))
    rounds, profiles = summary["time_by_round"], list(summary["time_by_profile"].values())
    for table in (rounds, profiles):
        assert sum(r["network_s"] for r in table) == pytest.approx(
            summary["client_network_seconds"])
        assert sum(r["tasks"] for r in table) == summary["tasks_issued"]
    trained = sum(e["network_seconds"] for e in _events(result.run_dir)
                  if e["kind"] in ("update_accepted", "update_refused"))
    assert summary["client_network_seconds"] > trained  # the evaluations' time is in it


def test_the_reports_accuracy_against_time_says_its_seconds_are_model_seconds(
        run_dir: Path) -> None:
    from fedlink.metrics.report import ACCURACY_VS_TIME

    labels = [t.text for t in ET.parse(run_dir / ACCURACY_VS_TIME).getroot().iter(
        "{http://www.w3.org/2000/svg}text")]
    assert "model seconds since run start" in labels


def test_an_update_counts_when_its_commit_reaches_the_coordinator_not_when_its_answer_is_back(
        tmp_path: Path) -> None:
    """On a deterministic 3g link a task costs the check-in's round trip with the model in
    its answer, the training, then the commit's one leg up with the update: the engine takes
    the update when the request arrives, and the client checks in again once the answer
    came back, one one-way latency later (as over gRPC: timing it a round trip before the
    engine saw the update delayed every flush, and so every version, by that leg)."""
    from fedlink.netem.presets import preset
    from fedlink.sim import run_simulation

    link = preset("3g")
    one_way = link.latency_ms / 1000.0
    down_rate, up_rate = link.down_kbps * 1000 / 8, link.up_kbps * 1000 / 8
    config = ExperimentConfig.from_dict({
        "run": {"name": "legs", "seed": 1, "mode": "virtual"},
        "data": {"dataset": "digits", "clients": 2},
        "model": {"name": "logreg"},
        "coordinator": {"rounds": 2, "flush": {"goal": 2},
                        "training": {"local_epochs": 1, "learning_rate": 0.5}},
        "virtual": {"deterministic": True, "step_cost_s": 0.5},
        "network": {"preset": "3g"},
    })
    events = _events(run_simulation(config, tmp_path, progress=False).run_dir)
    issued = {e["task_id"]: e for e in events if e["kind"] == "task_issued"}
    flushes = {e["model_version"]: e for e in events if e["kind"] == "flush"}
    accepted = [e for e in events if e["kind"] == "update_accepted"]
    assert len(accepted) == 4
    for update in accepted:
        flush = flushes[update["base_version"] + 1]
        bytes_down = flush["bytes_down"] / flush["num_updates"]  # the same model to each
        network = 2 * one_way + bytes_down / down_rate + one_way + update["bytes_up"] / up_rate
        assert update["network_seconds"] == pytest.approx(network)
        task = issued[update["task_id"]]
        assert update["elapsed"] - task["elapsed"] == pytest.approx(
            update["train_seconds"] + network)
    first_round = [e for e in accepted if e["base_version"] == 0]
    next_tasks = [e for e in issued.values() if e["model_version"] == 1]
    assert {t["client_id"] for t in next_tasks} == {u["client_id"] for u in first_round}
    for task in next_tasks:  # the flush's answer on its way back, then the check-in
        assert task["elapsed"] == pytest.approx(flushes[1]["elapsed"] + one_way)
