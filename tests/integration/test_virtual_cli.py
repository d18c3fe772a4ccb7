"""``fedlink simulate`` of ``examples/population_1m.toml`` (shrunk): progress in model time,
and the usual run folder and report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "population_1m.toml"


def test_population_example_prints_model_time_and_writes_the_run_folder(tmp_path: Path) -> None:
    text = EXAMPLE.read_text().replace("population = 1_000_000", "population = 2_000")
    text = text.replace("rounds = 20", "rounds = 2").replace("goal = 800", "goal = 40")
    text = text.replace("min_updates = 400", "min_updates = 20")
    config = tmp_path / "small.toml"
    config.write_text(text)
    done = subprocess.run([sys.executable, "-m", "fedlink", "simulate", str(config),
                           "--output-dir", str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ),
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "round 2/2  model time " in done.stderr
    run_dir = tmp_path / "runs" / "population-1m"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["mode"] == "virtual"
    # model time and wall time both reported; how they compare depends on the machine's load
    assert summary["model_seconds"] > 0 and summary["loop_wall_seconds"] > 0
    assert set(summary["time_by_profile"]) <= {"4g", "3g", "edge-2g", "flaky", "commute"}
    assert (run_dir / "report.md").is_file() and (run_dir / "model.npy").is_file()
    events = [json.loads(line) for line in (run_dir / "events.jsonl").open()]
    assert {"task_issued", "update_accepted", "flush"} <= {e["kind"] for e in events}
    flushes = [e for e in events if e["kind"] == "flush"]
    assert 0 < flushes[-1]["model_seconds"] <= summary["model_seconds"]
