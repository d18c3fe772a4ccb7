"""The run report of ``fedlink simulate``: written by the run's own process with SVG plots (the
same report as ``write_report`` writes from the run folder), with no plotting library loaded
and no helper process, and skipped with ``--no-report``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from fedlink.metrics import EVENTS_FILENAME, read_events, write_report

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
    return {p.name for p in run_dir.iterdir() if p.suffix in (".md", ".svg", ".png")}


def test_simulate_writes_the_same_report_as_write_report(tmp_path: Path) -> None:
    run_dir = _simulate(tmp_path)
    by_run = (run_dir / "report.md").read_text()
    files = _report_files(run_dir)
    assert {"report.md", "accuracy_vs_round.svg", "comm_vs_compute.svg"} <= files
    summary = json.loads((run_dir / "summary.json").read_text())
    for name in files:
        (run_dir / name).unlink()
    write_report(run_dir, read_events(run_dir / EVENTS_FILENAME), summary)
    assert (run_dir / "report.md").read_text() == by_run
    assert _report_files(run_dir) == files


def test_no_report_writes_the_run_folder_without_report_or_plots(tmp_path: Path) -> None:
    run_dir = _simulate(tmp_path, "--no-report")
    assert {"events.jsonl", "summary.json", "model.npy", "model.pt"} <= {
        p.name for p in run_dir.iterdir()}
    assert _report_files(run_dir) == set()
    assert json.loads((run_dir / "summary.json").read_text())["final_accuracy"] is not None


def test_a_simulate_process_with_its_report_loads_no_plotting_library(tmp_path: Path) -> None:
    """The whole ``fedlink simulate`` process: no matplotlib in it, and no helper process
    started to draw (a report costs a small run milliseconds, not a library's import)."""
    config = tmp_path / "tiny.toml"
    config.write_text(CONFIG)
    code = ("import json, subprocess, sys\n"
            "started = []\n"
            "real = subprocess.Popen.__init__\n"
            "def record(self, args, *a, **k):\n"
            "    started.append(str(args))\n"
            "    real(self, args, *a, **k)\n"
            "subprocess.Popen.__init__ = record\n"
            "from fedlink.cli import main\n"
            f"code = main(['simulate', {str(config)!r}, '--no-progress',\n"
            f"             '--output-dir', {str(tmp_path / 'runs')!r}])\n"
            "loaded = sorted({m.split('.')[0] for m in sys.modules} & {'matplotlib', 'PIL'})\n"
            "print(json.dumps({'code': code, 'loaded': loaded, 'started': started}))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer == {"code": 0, "loaded": [], "started": []}
    assert "accuracy_vs_round.svg" in _report_files(tmp_path / "runs" / "tiny")
