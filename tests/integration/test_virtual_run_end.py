"""How a virtual-clock run ends, and what it records of it: its rounds done, a target accuracy
reached (on exactly that flush, as over gRPC), and the settings it cannot apply refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fedlink.errors import ConfigError
from fedlink.experiment.config import ExperimentConfig

ROUNDS = 8


def _run(tmp_path: Path, name: str, max_model_s: float = 0.0,
         **run: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Elastic rounds over 30 synthetic clients on a mixed fleet; its events and summary."""
    from fedlink.sim.virtual.runner import run_virtual

    config = ExperimentConfig.from_dict({
        "run": {"name": name, "seed": 4, "mode": "virtual", **run},
        "coordinator": {"rounds": ROUNDS,
                        "flush": {"goal": 6, "deadline_s": 30.0, "over_selection": 1.5,
                                  "min_updates": 3, "max_staleness": 2},
                        "training": {"local_steps": 5, "learning_rate": 0.5}},
        "virtual": {"population": 30, "deterministic": True, "max_model_s": max_model_s},
        "network": {"fleet": {"4g": 0.5, "3g": 0.5}},
    })
    result = run_virtual(config, tmp_path, progress=False, report=False)
    events = [json.loads(line)
              for line in (result.run_dir / "events.jsonl").read_text().splitlines()]
    return events, result.summary


def test_a_virtual_run_records_why_it_ended(tmp_path: Path) -> None:
    events, summary = _run(tmp_path, "all-rounds")
    [finished] = [e for e in events if e["kind"] == "run_finished"]
    assert finished["reason"] == summary["finish_reason"] == f"completed {ROUNDS} rounds"
    assert finished["model_version"] == ROUNDS


def test_a_virtual_run_ends_on_the_first_flush_at_its_target_accuracy(tmp_path: Path) -> None:
    events, _ = _run(tmp_path, "no-target")
    accuracies = [e["accuracy"] for e in events if e["kind"] == "flush"]
    # a target first reached after the first version and before the last
    target = max(accuracies[: ROUNDS // 2])
    first = next(i for i, a in enumerate(accuracies) if a >= target)
    assert 0 < first < ROUNDS - 1, accuracies
    events, summary = _run(tmp_path, "target", target_accuracy=target)
    flushes = [e for e in events if e["kind"] == "flush"]
    assert [e["accuracy"] for e in flushes] == accuracies[: first + 1]
    [finished] = [e for e in events if e["kind"] == "run_finished"]
    assert finished["reason"] == summary["finish_reason"] == f"reached the target accuracy {target}"


def test_a_virtual_run_ends_at_its_model_time_limit_not_after_it(tmp_path: Path) -> None:
    """The flush due after the limit is not made, and the record ends at the limit."""
    events, _ = _run(tmp_path, "no-limit")
    times = [e["elapsed"] for e in events if e["kind"] == "flush"]
    limit = round((times[2] + times[3]) / 2, 1)  # between the third and fourth flushes
    events, summary = _run(tmp_path, "limit", max_model_s=limit)
    assert [e["elapsed"] for e in events if e["kind"] == "flush"] == times[:3]
    [finished] = [e for e in events if e["kind"] == "run_finished"]
    assert finished["reason"] == summary["finish_reason"] == f"model time limit {limit:g} s reached"
    assert finished["elapsed"] == pytest.approx(limit)
    assert max(e["elapsed"] for e in events) == pytest.approx(limit)


def test_partial_work_is_refused_in_virtual_mode(tmp_path: Path) -> None:
    """It wraps the real trainers of a gRPC run; the virtual clock charges every step."""
    from fedlink.sim.virtual.runner import run_virtual

    config = ExperimentConfig.from_dict({
        "run": {"name": "partial", "mode": "virtual"},
        "virtual": {"population": 10},
        "partial_work": {"fraction": 0.5},
    })
    with pytest.raises(ConfigError, match=r"partial_work\.fraction: .*grpc"):
        run_virtual(config, tmp_path, progress=False, report=False)
