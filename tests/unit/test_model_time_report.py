"""Model time in the summary and the report (``fedlink.metrics.model_time``), from hand-made
events: hours on the axis for a long run, and a real-time run's report saying why it has none."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from fedlink.metrics import summarize, write_report
from fedlink.metrics.model_time import time_shares, time_unit

START = 1_700_000_000.0
PLOTS = ("accuracy_vs_model_time.svg", "accuracy_vs_simulation_time.svg", "comm_vs_compute.svg")


def _flush(wall: float, model_s: float | None, version: int, accuracy: float) -> dict[str, Any]:
    """A flush written ``wall`` seconds into the simulation, ``model_s`` into model time."""
    fields = {"model_seconds": model_s} if model_s is not None else {}
    return {"t": START + wall, "elapsed": model_s if model_s is not None else wall,
            "kind": "flush", "model_version": version, "num_updates": 2, "accuracy": accuracy,
            **fields}


def _virtual_summary(events: list[dict[str, Any]]) -> dict[str, Any]:
    """What a virtual run's summary holds: ``summarize`` plus the loop's figures."""
    summary = summarize(events, {"run_name": "long"})
    summary.update(model_seconds=6 * 3600.0, simulation_seconds=3.0, communication_share=0.25,
                   **time_shares({0: {"tasks": 2, "network_s": 100.0, "compute_s": 300.0},
                                  1: {"tasks": 2, "network_s": 0.0, "compute_s": 0.0}},
                                 {"3g": {"tasks": 4, "network_s": 100.0, "compute_s": 300.0}}))
    return summary


def test_summary_carries_accuracy_against_model_and_wall_time() -> None:
    events = [{"t": START, "elapsed": 0.0, "kind": "task_issued"},
              _flush(1.0, 2 * 3600.0, 1, 0.5), _flush(2.5, 5 * 3600.0, 2, 0.7)]
    curve = summarize(events, {})["accuracy_by_time"]
    assert curve == {"model_version": [1, 2], "accuracy": [0.5, 0.7],
                     "model_seconds": [7200.0, 18000.0], "simulation_seconds": [1.0, 2.5]}


def test_time_shares_split_each_row_and_keep_a_row_without_time() -> None:
    shares = time_shares({1: {"tasks": 3, "network_s": 1.0, "compute_s": 3.0},
                          0: {"tasks": 1, "network_s": 0.0, "compute_s": 0.0}}, {})
    assert shares["time_by_round"] == [
        {"round": 1, "model_version": 0, "tasks": 1, "network_s": 0.0, "compute_s": 0.0,
         "comm_share": None},
        {"round": 2, "model_version": 1, "tasks": 3, "network_s": 1.0, "compute_s": 3.0,
         "comm_share": 0.25}]


@pytest.mark.parametrize(("span", "unit"), [(30.0, "seconds"), (600.0, "minutes"),
                                            (5 * 3600.0, "hours")])
def test_time_axis_is_in_hours_for_a_long_run(span: float, unit: str) -> None:
    assert time_unit([0.0, span])[1] == unit


def test_long_virtual_run_report_has_the_model_time_section(tmp_path: Path) -> None:
    events = [{"t": START, "elapsed": 0.0, "kind": "task_issued"},
              _flush(1.0, 2 * 3600.0, 1, 0.5), _flush(2.5, 5 * 3600.0, 2, 0.7)]
    text = write_report(tmp_path, events, _virtual_summary(events)).read_text()
    assert "The run lasted 6h 00m of model time" in text
    for plot in PLOTS:
        assert ET.parse(tmp_path / plot).getroot().tag == "{http://www.w3.org/2000/svg}svg"
        assert f"]({plot})" in text
    assert "| 1 | 2 | 1m 40s | 5m 00s | 25% |" in text  # round 1: network, compute, share
    assert "| 2 | 2 | 0.00 s | 0.00 s | - |" in text  # a round without time has no share
    assert "| 3g | 4 | 1m 40s | 5m 00s | 25% |" in text


def test_real_time_run_report_says_why_it_has_no_model_time(tmp_path: Path) -> None:
    events = [{"t": START, "elapsed": 0.0, "kind": "task_issued"},
              _flush(1.0, None, 1, 0.5), _flush(2.0, None, 2, 0.6)]
    summary = summarize(events, {})
    assert "accuracy_by_time" not in summary
    text = write_report(tmp_path, events, summary).read_text()
    assert "## Model time\n\nNone: this run ran on real time" in text
    assert not any((tmp_path / plot).exists() for plot in PLOTS)
    assert (tmp_path / "accuracy_vs_time.svg").exists()  # its wall-clock plot stays
