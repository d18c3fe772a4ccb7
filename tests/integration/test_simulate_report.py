"""The run report of ``fedlink simulate``: drawn by a helper process that got ready during the
run (the same report as drawn in the run's process), skipped with ``--no-report``, and still
written in the run's process when the helper fails."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from fedlink.metrics import EVENTS_FILENAME, read_events, write_report
from fedlink.metrics.report_worker import ReportWriter

CONFIG = """
[run]
name = "tiny"
seed = 0
mode = "virtual"

[data]
dataset = "digits"
clients = 4

[model]
name = "mlp"
options = { hidden = [16] }

[coordinator]
rounds = 2

[coordinator.flush]
goal = 4
min_updates = 4
"""


def _simulate(tmp_path: Path, *flags: str) -> Path:
    config = tmp_path / "tiny.toml"
    config.write_text(CONFIG)
    out = tmp_path / ("runs" + "".join(flags))
    done = subprocess.run([sys.executable, "-m", "fedlink", "simulate", str(config),
                           "--no-progress", "--output-dir", str(out), *flags],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return out / "tiny"


def _report_files(run_dir: Path) -> set[str]:
    return {p.name for p in run_dir.iterdir() if p.suffix in (".md", ".png")}


def test_simulate_writes_the_same_report_as_drawing_it_in_the_run(tmp_path: Path) -> None:
    run_dir = _simulate(tmp_path)
    by_helper = (run_dir / "report.md").read_text()
    files = _report_files(run_dir)
    assert "report.md" in files and "accuracy_vs_round.png" in files
    summary = json.loads((run_dir / "summary.json").read_text())
    for name in files:
        (run_dir / name).unlink()
    write_report(run_dir, read_events(run_dir / EVENTS_FILENAME), summary)
    assert (run_dir / "report.md").read_text() == by_helper
    assert _report_files(run_dir) == files


def test_no_report_writes_the_run_folder_without_report_or_plots(tmp_path: Path) -> None:
    run_dir = _simulate(tmp_path, "--no-report")
    assert {"events.jsonl", "summary.json", "model.npy", "model.pt"} <= {
        p.name for p in run_dir.iterdir()}
    assert _report_files(run_dir) == set()
    assert json.loads((run_dir / "summary.json").read_text())["final_accuracy"] is not None


def test_a_failed_helper_leaves_the_report_to_the_run(tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    run_dir = _simulate(tmp_path, "--no-report")
    events = read_events(run_dir / EVENTS_FILENAME)
    summary = json.loads((run_dir / "summary.json").read_text())
    (run_dir / "summary.json").unlink()  # the helper reads it from disk: it fails
    with caplog.at_level(logging.WARNING), ReportWriter(background=True) as writer:
        path = writer.write(run_dir, events, summary)
    assert path == run_dir / "report.md" and path.is_file()
    assert "accuracy_vs_round.png" in _report_files(run_dir)
    assert any("report helper failed" in r.getMessage() for r in caplog.records)


def test_an_unused_helper_is_stopped(tmp_path: Path) -> None:
    writer = ReportWriter(background=True)
    helper = writer._helper
    assert helper is not None
    writer.close()
    assert helper.returncode is not None  # reaped: it exited when its input closed
