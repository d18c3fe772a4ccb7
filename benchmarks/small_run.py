"""A small run's whole process: ``fedlink simulate`` (virtual mode) against pfl-research.

20 clients x 10 rounds of synchronous FedAvg on digits, the same task on both sides: the
clients' data is fedlink's IID split of digits (written to an ``.npz`` that both sides load),
an MLP 64-64-10, one local epoch of minibatches of 16 at learning rate 0.3 (``vs_pfl/task.py``),
updates weighted by examples, the central test accuracy after every round. pfl runs
``vs_pfl/run_pfl.py`` with its per-user evaluation off, so both sides do the same work. Both
aggregate by plain weighted FedAvg, as in ``vs_pfl_ratio``: fedlink's flush guard
(``[coordinator.robust]``) and streaming adaptive norm bound are off on its side;
``small_run_ratio_guarded`` is fedlink with its defaults (guard on) against the same pfl runs.

What is timed is the whole process, from starting the interpreter to its exit: imports, data,
the run and (for fedlink) writing the run folder, ``report.md`` and its plots included. That is
what a researcher sweeping small configurations waits for. Pairs alternate (pfl, fedlink with
the report, fedlink with ``--no-report``, fedlink guarded with the report) so that a burst of
load on a shared machine lands on every side; each pair gives a ratio and the figure is the
median over pairs. Every process runs from compiled bytecode, as an installed package does
(pip compiles pfl's at install; fedlink's is written by one unmeasured run of each side first,
also when ``PYTHONDONTWRITEBYTECODE`` is set in the caller's environment).

Figures: ``small_run_ratio`` (fedlink with its report over pfl, whole process; target
<= 0.6), ``small_run_ratio_no_report``, ``small_run_ratio_guarded``, ``fedlink_process_s``,
``fedlink_no_report_process_s``, ``fedlink_guarded_process_s``, ``pfl_process_s`` (medians),
``fedlink_accuracy``, ``fedlink_guarded_accuracy``, ``pfl_accuracy``,
``fedlink_report_written`` (1 when ``report.md`` and its plots were written),
``small_run_pairs``.

pfl runs in a python that has it: ``--pfl-python PATH`` or ``FEDLINK_PFL_PYTHON``; without one
only the fedlink figures are reported and ``pfl_skipped`` says why.

Run: ``python benchmarks/small_run.py [--quick] [--json FILE] [--pfl-python PATH]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import parse_args, report
from vs_pfl import task

from fedlink.data import load_federated

CLIENTS, ROUNDS, SEED = 20, 10, 0
RUN_PFL = Path(__file__).resolve().parent / "vs_pfl" / "run_pfl.py"

CONFIG = f"""
[run]
name = "small-run"
seed = {SEED}
mode = "virtual"

[data]
dataset = "digits"
clients = {CLIENTS}
partition = "iid"

[model]
name = "mlp"
options = {{ hidden = {list(task.HIDDEN)} }}

[coordinator]
rounds = {ROUNDS}

[coordinator.flush]
goal = {CLIENTS}
min_updates = {CLIENTS}
deadline_s = 120.0

[coordinator.training]
local_epochs = 1
batch_size = {task.BATCH_SIZE}
learning_rate = {task.LEARNING_RATE}
"""


def _config(guarded: bool) -> str:
    """The experiment file: fedlink's defaults (``guarded``), else plain weighted FedAvg as
    pfl aggregates (the flush guard and the adaptive norm bound off)."""
    if guarded:
        return CONFIG
    return CONFIG.replace("[coordinator]\n", "[coordinator]\nnorm_bound_adaptive = false\n") + \
        "\n[coordinator.robust]\nenabled = false\n"


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pfl-python", default=None, metavar="PATH",
                        help="a python with pfl-research installed (default: "
                             "$FEDLINK_PFL_PYTHON)")


def _write_split(path: Path) -> None:
    """fedlink's IID split of digits as one ``.npz``: the clients' rows in order, offsets."""
    data = load_federated("digits", CLIENTS, SEED, "iid")
    offsets = np.cumsum([0] + [len(c.y) for c in data.clients])
    np.savez(path, x_train=np.concatenate([c.x for c in data.clients]),
             y_train=np.concatenate([c.y for c in data.clients]), offsets=offsets,
             x_test=data.test.x, y_test=data.test.y)


def _timed(command: list[str]) -> float:
    """Seconds from starting ``command`` to its exit (it must succeed), with bytecode caching
    on (see the module docstring)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    started = time.perf_counter()
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, check=False, env=env)
    if done.returncode:
        raise RuntimeError(f"{command[:3]} failed: {done.stderr[-2000:]}")
    return time.perf_counter() - started


def _fedlink(workdir: Path, side: str, *flags: str) -> float:
    """One ``fedlink simulate`` process of ``side``'s config, into its own output folder."""
    config = "guarded.toml" if side == "guarded" else "plain.toml"
    return _timed([sys.executable, "-m", "fedlink", "simulate", str(workdir / config),
                   "--no-progress", "--output-dir", str(workdir / side), *flags])


SIDES = ("pfl", "fedlink", "no_report", "guarded")
"""The processes of one pair, in the order they run."""


def _one_pair(pfl_python: str | None, split: Path, pfl_out: Path,
              workdir: Path) -> dict[str, float]:
    """Seconds of each side's whole process (no pfl without a python that has it)."""
    commands = {
        "pfl": lambda: _timed([str(pfl_python), str(RUN_PFL), str(split), str(CLIENTS),
                               str(CLIENTS), str(ROUNDS), str(pfl_out)]),
        "fedlink": lambda: _fedlink(workdir, "fedlink"),
        "no_report": lambda: _fedlink(workdir, "no_report", "--no-report"),
        "guarded": lambda: _fedlink(workdir, "guarded")}
    return {side: commands[side]() for side in SIDES if side != "pfl" or pfl_python}


def _accuracy(workdir: Path, side: str) -> float | None:
    summary = json.loads((workdir / side / "small-run" / "summary.json").read_text())
    return summary.get("final_accuracy")


def measure(pairs: int, pfl_python: str | None, workdir: Path) -> dict[str, Any]:
    """Alternating whole-process runs after one unmeasured pair; medians and the median
    paired ratios."""
    (workdir / "plain.toml").write_text(_config(guarded=False))
    (workdir / "guarded.toml").write_text(_config(guarded=True))
    split, pfl_out = workdir / "split.npz", workdir / "pfl.json"
    _write_split(split)
    _one_pair(pfl_python, split, pfl_out, workdir)  # bytecode written, files cached
    runs = [_one_pair(pfl_python, split, pfl_out, workdir) for _ in range(pairs)]
    times = {side: [run[side] for run in runs] for side in runs[0]}
    run_dir = workdir / "fedlink" / "small-run"
    figures: dict[str, Any] = {
        "small_run_pairs": pairs,
        "fedlink_process_s": statistics.median(times["fedlink"]),
        "fedlink_no_report_process_s": statistics.median(times["no_report"]),
        "fedlink_guarded_process_s": statistics.median(times["guarded"]),
        "fedlink_accuracy": _accuracy(workdir, "fedlink"),
        "fedlink_guarded_accuracy": _accuracy(workdir, "guarded"),
        "fedlink_report_written": int((run_dir / "report.md").is_file()
                                      and any(run_dir.glob("*.svg")))}
    if not pfl_python:
        figures["pfl_skipped"] = "no python with pfl: give --pfl-python or FEDLINK_PFL_PYTHON"
        return figures
    figures["pfl_process_s"] = statistics.median(times["pfl"])
    figures["pfl_accuracy"] = json.loads(pfl_out.read_text())["accuracy"]
    for name, key in (("small_run_ratio", "fedlink"), ("small_run_ratio_no_report", "no_report"),
                      ("small_run_ratio_guarded", "guarded")):
        figures[name] = statistics.median(f / p for f, p in zip(times[key], times["pfl"],
                                                                 strict=True))
    return figures


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], _arguments)
    pfl_python = args.pfl_python or os.environ.get("FEDLINK_PFL_PYTHON")
    with tempfile.TemporaryDirectory() as tmp:
        report(measure(2 if args.quick else 5, pfl_python, Path(tmp)), args.json)


if __name__ == "__main__":
    main()
