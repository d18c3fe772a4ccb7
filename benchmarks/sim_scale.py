"""Virtual-clock simulation at scale: a million lazy clients, cost per round vs population, and
the speed-up over real-gRPC simulation of the same config.

Each large run is a whole ``python -m fedlink simulate`` process (wall time and peak RSS of
that process), of ``examples/population_1m.toml`` at the population asked for. Figures:

- ``population_1m_wall_s`` / ``population_1m_rss_mb``: 10^6 clients (``--quick``: 10^5 and 5
  rounds, named ``population_quick_*``), cohort 1,000, a mixed poor fleet, diurnal
  availability;
- ``population_cost_ratio``: loop wall per round at the large population over the same at
  10,000 clients (cost follows the cohort, not the population);
- ``virtual_vs_grpc_speedup``: the same digits/MLP experiment (1,000 clients, cohort 100,
  10 rounds; ``--quick``: 200 clients, 5 rounds) over ``make demo``'s poor fleet (4G, 3G,
  flaky and commuting links), a whole real-gRPC ``fedlink simulate`` process's wall over a
  whole virtual one's (data, set-up and the report included, which both modes pay alike).
  Real gRPC carries every byte through a ``TcpProxy`` that delays, throttles and resets it
  in real time; the virtual loop charges the same links in model time.
  ``virtual_vs_grpc_run_speedup`` is the same for the run itself: the clients' phase of the
  real-gRPC run (``simulation_seconds``: from the sessions' start to the run's end) over the
  virtual loop's wall (``loop_wall_seconds``). The real-gRPC run's wall varies by a third
  from run to run (its stragglers' blackouts fall differently), so the poor-fleet pair runs
  three times (``--quick``: once): the figure is the median ratio, with
  ``virtual_vs_grpc_speedup_min``/``_max`` beside it and the median pair's walls.
  ``virtual_vs_grpc_clean_speedup`` (and
  ``_clean_run_speedup``): the same on clean links, where both modes spend their time on the
  same local training and the gap is gRPC's per-call cost alone. Each mode's wall, run phase
  and final accuracy are beside them (``speedup_{poor,clean}_{grpc,virtual}_*``);
  ``--only speedup`` measures these alone.

- ``parallel_speedup_2_workers``: a virtual run whose local training dominates (digits, an
  MLP 256-256, 10 local epochs, cohort 20), loop wall with ``[virtual] workers = 0`` over
  the same with 2 worker processes (same numbers: the run's final models must agree), in this
  process; ``parallel_wall_0_s``/``parallel_wall_2_s`` beside it. Workers' start-up (spawn,
  torch import, data, the first trainer) is outside the loop's wall and reported as
  ``parallel_startup_s`` (inline training pays its first trainer before the loop too).
  Five inline/2-worker pairs run, alternately; the figure is the median pair's ratio, with
  ``parallel_speedup_min``/``_max`` beside it (the same inline run's wall moved between 4.1
  and 6.0 s in one quarter of an hour on this box, and a pair's ratio between 1.46 and 1.73).
  ``ray_speedup_2_actors``: the same with ``[run] backend = "ray"`` and 2 actors over inline,
  when ray is installed (``ray_startup_s``: starting Ray and its actors).
  ``--only parallel`` measures these alone.

- ``grpc_10k_completed``: a real-gRPC ``fedlink simulate`` process of 10,000 clients
  (synthetic data, logistic regression, cohort 100, 3 rounds; ``--quick``: 2,000 clients, named
  ``grpc_quick_*``) ran to its end (1) or not (0), with ``grpc_10k_wall_s`` and
  ``grpc_10k_rss_mb``.

- ``vs_pfl_ratio``: pfl-research (``pfl``) on the same task in the same run (``vs_pfl/task.py``:
  100,000 lazily made users of digits samples, cohort 1,000, 10 rounds, an MLP 64-64-10, one local
  epoch, clean links; ``--quick``: 10,000 users, cohort 100, 3 rounds), fedlink's virtual-mode wall
  (``fedlink_virtual_wall_s``) over pfl's (``pfl_wall_s``), each from building the model to the end
  of the last round, with both final test accuracies. Like for like: both sides train the sampled
  users and evaluate the central model every round, and nothing else (pfl's per-user evaluation
  off); the median ratio of ``VS_PFL_PAIRS`` (5) alternating pairs (``--quick``: 1; a machine's
  speed can drift by a tenth or more between minutes, and a pair's two runs share the drift), with
  ``vs_pfl_ratio_pfl_per_user_eval`` the old configuration's figure (pfl also evaluating every
  sampled user before and after training) as a named extra. Both sides aggregate by plain weighted
  FedAvg (fedlink's flush guard, on by default, off); ``vs_pfl_ratio_fedlink_guarded`` is fedlink
  with its default guard against the same pfl run. pfl runs in a python that has it: ``--pfl-python
  PATH`` or ``FEDLINK_PFL_PYTHON``, else this one if it can import pfl; without one the figure is
  absent and ``vs_pfl_skipped`` says why. ``--vs-pfl-only`` runs just this comparison.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import parse_args, report

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "population_1m.toml"
RUN_PFL = Path(__file__).resolve().parent / "vs_pfl" / "run_pfl.py"


def _population_run(population: int, rounds: int, workdir: Path) -> dict[str, float]:
    """One ``fedlink simulate`` process of the example at ``population``: wall, RSS, per round."""
    text = EXAMPLE.read_text().replace("population = 1_000_000", f"population = {population}")
    text = text.replace("rounds = 20", f"rounds = {rounds}")
    config = workdir / f"pop{population}.toml"
    config.write_text(text)
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "fedlink", "simulate", str(config), "--output-dir",
                    str(workdir / f"runs{population}"), "--no-progress"], check=True,
                   stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    rss_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    summary = json.loads((workdir / f"runs{population}" / "population-1m" /
                          "summary.json").read_text())
    return {"wall_s": wall, "rss_mb": max(rss_kb, before) / 1024.0,
            "per_round_s": summary["loop_wall_seconds"] / rounds,
            "model_hours": summary["model_seconds"] / 3600.0,
            "accuracy": summary.get("final_accuracy") or 0.0}


GRPC_POPULATION = """
[run]
name = "grpc-population"
seed = 1
[data]
dataset = "synthetic"
clients = {clients}
[model]
name = "logreg"
[coordinator]
rounds = 3
[coordinator.flush]
goal = 100
deadline_s = 0
"""


def _grpc_population(clients: int, workdir: Path) -> dict[str, float]:
    """One real-gRPC ``fedlink simulate`` process of ``clients``: finished?, wall, peak RSS."""
    config = workdir / f"grpc{clients}.toml"
    config.write_text(GRPC_POPULATION.format(clients=clients))
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "fedlink", "simulate", str(config),
                           "--output-dir", str(workdir / f"grpc{clients}"), "--no-progress"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - started
    rss_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if done.returncode:
        print(done.stderr[-2000:], file=sys.stderr)
    return {"completed": int(done.returncode == 0), "wall_s": wall,
            "rss_mb": max(rss_kb, before) / 1024.0}


SPEEDUP_EXPERIMENT = """
[run]
name = "speed-{mode}"
seed = 1
mode = "{mode}"
[data]
dataset = "digits"
clients = {clients}
[model]
name = "mlp"
[coordinator]
rounds = {rounds}
[coordinator.flush]
goal = 100
deadline_s = 0
"""

POOR_FLEET = '[network]\nfleet = { "4g" = 0.3, "3g" = 0.4, flaky = 0.2, commute = 0.1 }\n'
"""``make demo``'s poor fleet (``examples/demo_poor_network.toml``)."""


def _mode_run(mode: str, links: str, clients: int, rounds: int,
              workdir: Path) -> dict[str, float]:
    """One whole ``fedlink simulate`` process of the speed-up experiment in ``mode``: its
    wall, the run's own phase (gRPC: the sessions' start to the end; virtual: the loop) and
    the final accuracy."""
    text = SPEEDUP_EXPERIMENT.format(mode=mode, clients=clients, rounds=rounds)
    config = workdir / f"speed-{mode}-{links}.toml"
    config.write_text(text + (POOR_FLEET if links == "poor" else ""))
    out = workdir / f"speed-{links}"
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "fedlink", "simulate", str(config),
                           "--output-dir", str(out), "--no-progress"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - started
    if done.returncode:
        print(done.stderr[-2000:], file=sys.stderr)
        raise RuntimeError(f"{mode} run of {clients} clients ({links} links) failed")
    summary = json.loads((out / f"speed-{mode}" / "summary.json").read_text())
    run = summary["simulation_seconds" if mode == "grpc" else "loop_wall_seconds"]
    return {"wall_s": wall, "run_s": float(run),
            "accuracy": float(summary.get("final_accuracy") or 0.0)}


def _speedup(clients: int, rounds: int, repeats: int, workdir: Path) -> dict[str, Any]:
    """Real gRPC over virtual, on the poor fleet (``repeats`` pairs, the median) and on clean
    links (once); see the docstring."""
    figures: dict[str, Any] = {"speedup_clients": clients, "speedup_poor_repeats": repeats}
    for links, name, times in (("poor", "virtual_vs_grpc", repeats),
                               ("clean", "virtual_vs_grpc_clean", 1)):
        pairs = [{mode: _mode_run(mode, links, clients, rounds, workdir)
                  for mode in ("grpc", "virtual")} for _ in range(times)]
        ratios = sorted(p["grpc"]["wall_s"] / p["virtual"]["wall_s"] for p in pairs)
        middle = sorted(pairs, key=lambda p: p["grpc"]["wall_s"] / p["virtual"]["wall_s"])[
            len(pairs) // 2]
        for mode, run in middle.items():
            figures.update({f"speedup_{links}_{mode}_{k}": v for k, v in run.items()})
        figures[f"{name}_speedup"] = ratios[len(ratios) // 2]
        figures[f"{name}_run_speedup"] = middle["grpc"]["run_s"] / middle["virtual"]["run_s"]
        if times > 1:
            figures[f"{name}_speedup_min"], figures[f"{name}_speedup_max"] = ratios[0], ratios[-1]
    return figures


def _speedup_size(quick: bool) -> tuple[int, int, int]:
    """(clients, rounds, poor-fleet repeats) of the mode comparison."""
    return (200, 5, 1) if quick else (1000, 10, 3)


PARALLEL_REPEATS = 5
"""Inline/2-worker pairs of the training-backend comparison (the figure is the median ratio)."""

VS_PFL_PAIRS = 5
"""pfl/fedlink pairs of ``vs_pfl_ratio`` (the figure is the median of their ratios)."""


def _backend_run(backend: str, workers: int, rounds: int,
                 workdir: Path) -> tuple[float, float, Any]:
    """One virtual run where training dominates: (loop wall, start-up, final model)."""
    import numpy as np

    from fedlink.sim import ExperimentConfig, run_simulation

    config = ExperimentConfig.from_dict({
        "run": {"name": f"{backend}-{workers}", "seed": 2, "mode": "virtual",
                "backend": backend},
        "data": {"dataset": "digits", "clients": 60},
        "model": {"name": "mlp", "options": {"hidden": [256, 256]}},
        "coordinator": {"rounds": rounds, "flush": {"goal": 20, "deadline_s": 0},
                        "training": {"local_epochs": 10, "batch_size": 8}},
        "virtual": {"workers": workers},
    })
    started = time.perf_counter()
    result = run_simulation(config, workdir, progress=False)
    wall = result.summary["loop_wall_seconds"]
    return wall, time.perf_counter() - started - wall, np.load(result.run_dir / "model.npy")


def _parallel(rounds: int, workdir: Path) -> dict[str, float]:
    """Loop wall inline and with 2 worker processes (``PARALLEL_REPEATS`` pairs, the median
    ratio), and once with 2 Ray actors when ray is installed, on a run where training
    dominates; the same run each time (the final models must agree)."""
    import numpy as np

    pairs = [(_backend_run("inline", 0, rounds, workdir),
              _backend_run("processes", 2, rounds, workdir)) for _ in range(PARALLEL_REPEATS)]
    pairs.sort(key=lambda pair: pair[0][0] / pair[1][0])
    (inline, _, model), (pool, pool_startup, pool_model) = pairs[len(pairs) // 2]
    ratios = [a[0] / b[0] for a, b in pairs]
    figures = {"parallel_speedup_2_workers": inline / pool,
               "parallel_speedup_min": ratios[0], "parallel_speedup_max": ratios[-1],
               "parallel_wall_0_s": inline, "parallel_wall_2_s": pool,
               "parallel_startup_s": pool_startup,
               "parallel_max_model_difference": float(np.max(np.abs(model - pool_model)))}
    if importlib.util.find_spec("ray") is not None:
        ray, ray_startup, ray_model = _backend_run("ray", 2, rounds, workdir)
        figures.update({"ray_speedup_2_actors": inline / ray, "ray_wall_2_s": ray,
                        "ray_startup_s": ray_startup,
                        "ray_max_model_difference": float(np.max(np.abs(model - ray_model)))})
    return figures


def _pfl_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pfl-python", default=None, metavar="PATH",
                        help="a python with pfl-research installed (default: "
                             "$FEDLINK_PFL_PYTHON, else this one if it has pfl)")
    parser.add_argument("--vs-pfl-only", action="store_true",
                        help="run only the comparison with pfl-research")


def _pfl_python(given: str | None) -> tuple[str | None, str]:
    """The python to run pfl with, or None and why there is none."""
    python = given or os.environ.get("FEDLINK_PFL_PYTHON")
    if not python:
        if importlib.util.find_spec("pfl") is None:
            return None, ("pfl (pfl-research) is not installed in this python; give one that "
                          "has it with --pfl-python PATH or FEDLINK_PFL_PYTHON")
        python = sys.executable
    check = subprocess.run([python, "-c", "import pfl.model.pytorch"], capture_output=True,
                           text=True, check=False)
    if check.returncode:
        why = (check.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"{python} cannot import pfl's PyTorch backend ({why})"
    return python, ""


def _pfl_run(python: str, arrays: Path, size: tuple[int, int, int], out: Path,
             *extra: str) -> dict[str, Any] | str:
    """One pfl process on the task: its figures, plus ``process_s``; or why it failed."""
    started = time.perf_counter()
    done = subprocess.run([python, str(RUN_PFL), str(arrays), *map(str, size), str(out),
                           *extra], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, check=False)
    if done.returncode:
        print(done.stderr[-2000:], file=sys.stderr)
        return f"the pfl run failed (exit {done.returncode})"
    figures = json.loads(out.read_text())
    figures["process_s"] = time.perf_counter() - started
    return figures


def _vs_pfl(quick: bool, python: str, workdir: Path) -> dict[str, Any]:
    """pfl and fedlink's virtual mode on the same task and the same work, alternating.

    Both sides train every sampled user and evaluate the central model on the test set every
    round; pfl's per-user evaluation (before and after each user's training) is off, as the
    fedlink side does no such work (``vs_pfl/run_pfl.py``). ``VS_PFL_PAIRS`` pairs alternate the two
    sides so that a burst of load lands on both; each pair gives a ratio and the figure is the
    median. ``vs_pfl_ratio_pfl_per_user_eval`` is the old, unequal comparison (pfl also
    evaluating every user), one pair, kept as a named extra.
    """
    import statistics

    import numpy as np
    from vs_pfl import task
    from vs_pfl.fedlink_side import run_fedlink

    from fedlink.data.digits import digits

    size = (10_000, 100, 3) if quick else (100_000, 1_000, 10)
    repeats = 1 if quick else VS_PFL_PAIRS
    data = digits(1, np.random.default_rng(task.SEED))
    arrays, out = workdir / "digits.npz", workdir / "pfl.json"
    np.savez(arrays, x_train=data.train.x, y_train=data.train.y, x_test=data.test.x,
             y_test=data.test.y)
    pairs: list[tuple[dict[str, Any], dict[str, float]]] = []
    for _ in range(repeats):
        pfl = _pfl_run(python, arrays, size, out)
        if isinstance(pfl, str):
            return {"vs_pfl_skipped": pfl}
        pairs.append((pfl, run_fedlink(*size, data.train, data.test, workdir)))
    ratios = sorted(f["wall_s"] / p["wall_s"] for p, f in pairs)
    pfl, fedlink = pairs[[f["wall_s"] / p["wall_s"] for p, f in pairs].index(
        statistics.median_low(ratios))]
    figures: dict[str, Any] = {
        "vs_pfl_users": size[0], "vs_pfl_cohort": size[1], "vs_pfl_rounds": size[2],
        "vs_pfl_pairs": repeats, "pfl_wall_s": pfl["wall_s"], "pfl_process_s": pfl["process_s"],
        "pfl_accuracy": pfl["accuracy"], "fedlink_virtual_wall_s": fedlink["wall_s"],
        "fedlink_virtual_loop_s": fedlink["loop_wall_s"],
        "fedlink_virtual_accuracy": fedlink["accuracy"],
        "vs_pfl_accuracy_difference": fedlink["accuracy"] - pfl["accuracy"],
        "vs_pfl_ratio": statistics.median_low(ratios),
        "vs_pfl_ratio_min": ratios[0], "vs_pfl_ratio_max": ratios[-1]}
    unequal = _pfl_run(python, arrays, size, out, "--per-user-eval")
    if not isinstance(unequal, str):
        figures["pfl_per_user_eval_wall_s"] = unequal["wall_s"]
        figures["vs_pfl_ratio_pfl_per_user_eval"] = fedlink["wall_s"] / unequal["wall_s"]
    guarded = run_fedlink(*size, data.train, data.test, workdir, guarded=True)
    figures["fedlink_guarded_wall_s"] = guarded["wall_s"]
    figures["fedlink_guarded_accuracy"] = guarded["accuracy"]
    figures["vs_pfl_ratio_fedlink_guarded"] = guarded["wall_s"] / pfl["wall_s"]
    return figures


def _pfl_figures(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """The comparison's figures, or why it was not run."""
    python, why = _pfl_python(args.pfl_python)
    if python is None:
        print(f"vs_pfl_ratio not measured: {why}", file=sys.stderr)
        return {"vs_pfl_skipped": why}
    return _vs_pfl(args.quick, python, workdir)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], _pfl_arguments, parts=("parallel", "speedup"))
    if args.vs_pfl_only:
        with tempfile.TemporaryDirectory() as tmp:
            report(_pfl_figures(args, Path(tmp)), args.json)
        return
    if args.only == "parallel":  # the training-backend figures alone
        with tempfile.TemporaryDirectory() as tmp:
            report(_parallel(3 if args.quick else 10, Path(tmp)), args.json)
        return
    if args.only == "speedup":  # the two modes' comparison alone
        with tempfile.TemporaryDirectory() as tmp:
            report(_speedup(*_speedup_size(args.quick), Path(tmp)), args.json)
        return
    large, rounds = (100_000, 5) if args.quick else (1_000_000, 20)
    name = "population_quick" if args.quick else "population_1m"
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        big = _population_run(large, rounds, workdir)
        small = _population_run(10_000, rounds, workdir)
        figures[f"{name}_wall_s"] = big["wall_s"]
        figures[f"{name}_rss_mb"] = big["rss_mb"]
        figures[f"{name}_model_hours"] = big["model_hours"]
        figures[f"{name}_accuracy"] = big["accuracy"]
        figures["population_10k_wall_s"] = small["wall_s"]
        figures["population_cost_ratio"] = big["per_round_s"] / small["per_round_s"]
        figures.update(_parallel(3 if args.quick else 10, workdir))
        grpc_name = "grpc_quick" if args.quick else "grpc_10k"
        grpc = _grpc_population(2_000 if args.quick else 10_000, workdir)
        figures.update({f"{grpc_name}_{k}": v for k, v in grpc.items()})
        report(figures, None)  # the population and pool figures, before the slow gRPC one
        figures.update(_speedup(*_speedup_size(args.quick), workdir))
        figures.update(_pfl_figures(args, workdir))
    report(figures, args.json)


if __name__ == "__main__":
    main()
