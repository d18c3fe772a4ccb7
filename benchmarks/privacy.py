"""Differential privacy on digits: accuracy against epsilon, and what DP-SGD costs per step.

Three parts, all in this process:

1. **User-level DP (DP-FedAvg)**: ``examples/digits_dp_user.toml`` (100 clients, 50 per
   flush, logistic regression, S = 1, central noise, RDP accounting at delta 1e-3) run over
   real gRPC with noise multipliers ``z`` in ``USER_Z``, plus the same run without DP. Figures
   ``user_z<z>_epsilon`` and ``user_z<z>_accuracy`` (final accuracy), ``user_nodp_accuracy``.
2. **Sample-level DP-SGD**: ``examples/digits_dp_sgd.toml`` (10 clients, MLP 64-64, each
   client's DP-SGD through Opacus, C = 1, delta 1e-5) with ``sigma`` in ``SGD_SIGMA``, plus
   the same run with plain local SGD. Figures ``dpsgd_sigma<s>_epsilon`` (the largest epsilon
   a client reported), ``dpsgd_sigma<s>_accuracy``, ``dpsgd_nodp_accuracy``.
3. **Step time**: one client's data, the MLP 64-64, batch 64, one torch thread: time per
   step of ``DPSGDTrainer`` (ghost clipping, the default; and Opacus's classic per-example
   gradients, ``GradSampleModule``) against ``TorchTrainer``'s plain SGD, in short
   back-to-back tasks of 50 steps. Like with like: the same model and initial weights,
   the same data tensors sliced by an index (neither goes through a ``DataLoader``), batch 64
   (DP-SGD: a Poisson sample of expected size 64), the same learning rate and thread count;
   each task's time includes its per-task work (loading the weights, building the optimizer;
   DP-SGD also reports epsilon). Each repeat times all three in turn; a repeat's slowdown is
   the ratio within it, and the figure is the median over repeats (pairing keeps a burst of
   load on a shared machine from landing on one side only); the first repeat warms up and is
   not counted. Figures ``sgd_step_ms``, ``dpsgd_step_ms``, ``dpsgd_per_sample_step_ms``
   (medians), ``dpsgd_step_slowdown`` (target <= 3.0) and
   ``dpsgd_per_sample_step_slowdown``.
4. **Epsilon cost**: what one ``epsilon()`` call costs a client after a task's DP-SGD steps
   (``epsilon_call_ms``, with fedlink's cached accounting) against a fresh ``dp-accounting``
   RDP accountant composing the same history (``epsilon_call_ms_uncached``, what every call
   cost before the cache), their ratio ``epsilon_call_speedup``, and
   ``epsilon_max_abs_diff``: the largest difference between the two answers over a grid of
   ``(z, q, steps, delta)`` (must be <= 1e-9; the cache performs the same float operations,
   so it is 0).

Run: ``python benchmarks/privacy.py [--quick] [--json FILE]`` (``--quick``: fewer rounds and
steps; the same epsilon grid).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _common import parse_args, report

from fedlink.client import TrainPlan
from fedlink.client.torch_trainer import TorchTrainer
from fedlink.config import load_toml
from fedlink.data import load_federated
from fedlink.models import build_model
from fedlink.params import to_vector
from fedlink.privacy.dp_sgd import DPSGDTrainer
from fedlink.sim import ExperimentConfig, run_simulation

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
USER_Z = (0.5, 0.8, 1.5, 3.0)
SGD_SIGMA = (0.6, 1.0, 2.0)


def _run(table: dict[str, Any], out: Path) -> dict[str, Any]:
    """Simulate ``table``; the run's summary."""
    return run_simulation(ExperimentConfig.from_dict(table), out, progress=False).summary


def user_level(rounds: int, out: Path) -> dict[str, Any]:
    """Accuracy and epsilon of DP-FedAvg at each ``z`` in ``USER_Z``, and without DP."""
    figures: dict[str, Any] = {}
    for z in (*USER_Z, None):
        table = load_toml(EXAMPLES / "digits_dp_user.toml")
        table["coordinator"]["rounds"] = rounds
        table["coordinator"]["hooks"][0].update(noise_multiplier=z or 1.0, max_epsilon=0.0)
        if z is None:
            table["client"]["privacy"] = "none"
            del table["coordinator"]["hooks"]
        summary = _run(table, out)
        label = "user_nodp" if z is None else f"user_z{z:g}"
        if z is not None:
            figures[f"{label}_epsilon"] = summary["privacy"]["epsilon"]
        figures[f"{label}_accuracy"] = summary["final_accuracy"]
    return figures


def sample_level(rounds: int, out: Path) -> dict[str, Any]:
    """Accuracy and epsilon of DP-SGD at each ``sigma`` in ``SGD_SIGMA``, and plain SGD."""
    figures: dict[str, Any] = {}
    for sigma in (*SGD_SIGMA, None):
        table = load_toml(EXAMPLES / "digits_dp_sgd.toml")
        table["coordinator"]["rounds"] = rounds
        options = table["coordinator"]["training"]["trainer_options"]
        options["dp_noise_multiplier"] = sigma or 1.0
        if sigma is None:
            table["client"]["trainer"] = "torch"
            del table["coordinator"]["training"]["trainer_options"]
            del table["coordinator"]["hooks"]
        summary = _run(table, out)
        label = "dpsgd_nodp" if sigma is None else f"dpsgd_sigma{sigma:g}"
        if sigma is not None:
            figures[f"{label}_epsilon"] = summary["privacy"]["epsilon"]
        figures[f"{label}_accuracy"] = summary["final_accuracy"]
    return figures


def step_times(steps: int, repeats: int) -> dict[str, Any]:
    """ms per step of plain SGD and DP-SGD (both clipping modes); paired slowdowns."""
    torch.set_num_threads(1)
    data = load_federated("digits", 1, 0, None)

    def model() -> torch.nn.Module:
        return build_model("mlp", data.num_features, data.num_classes, seed=0, hidden=[64, 64])

    trainers: dict[str, Any] = {"sgd": TorchTrainer(model(), data.clients[0])}
    options: dict[str, dict[str, str]] = {"sgd": {}}
    for mode in ("ghost", "per_sample"):
        trainers[mode] = DPSGDTrainer(model(), data.clients[0])
        options[mode] = {"dp_noise_multiplier": "1.0", "dp_max_grad_norm": "1.0",
                         "dp_clipping": mode}
    start = to_vector(trainers["sgd"].model)
    samples: dict[str, list[float]] = {name: [] for name in trainers}
    for rep in range(repeats + 1):
        for name, trainer in trainers.items():
            plan = TrainPlan(local_steps=steps, batch_size=64, learning_rate=0.05, seed=rep,
                             options=options[name])
            began = time.perf_counter()
            trainer.train(start, plan)
            if rep:  # the first round warms up (lazy imports, allocator)
                samples[name].append((time.perf_counter() - began) / steps * 1e3)
    median = {name: statistics.median(v) for name, v in samples.items()}

    def paired(name: str) -> float:
        return statistics.median(d / s for d, s in zip(samples[name], samples["sgd"],
                                                         strict=True))

    return {"sgd_step_ms": median["sgd"], "dpsgd_step_ms": median["ghost"],
            "dpsgd_per_sample_step_ms": median["per_sample"],
            "dpsgd_step_slowdown": paired("ghost"),
            "dpsgd_per_sample_step_slowdown": paired("per_sample")}


def _uncached_epsilon(z: float, q: float, steps: int, delta: float) -> float:
    """Epsilon from a fresh dp-accounting RDP accountant, as every call computed it uncached."""
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    from fedlink.privacy.accounting import RDP_ORDERS

    accountant = RdpAccountant(list(RDP_ORDERS))
    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z))
    accountant.compose(dp_accounting.SelfComposedDpEvent(event, steps))
    return float(accountant.get_epsilon(delta))


def epsilon_costs(repeats: int) -> dict[str, Any]:
    """ms per ``epsilon()`` call cached (fedlink) and uncached; largest difference of answers."""
    from fedlink.privacy.accounting import Accountant

    grid = [(z, q, n, d) for z in (0.6, 1.0, 2.0) for q in (0.01, 0.064, 0.2)
            for n in (1, 50, 3000) for d in (1e-5, 1e-3)]
    diff = 0.0
    for z, q, n, d in grid:
        cached = Accountant("rdp")
        cached.step(z, q, n)
        diff = max(diff, abs(cached.epsilon(d) - _uncached_epsilon(z, q, n, d)))
    accountant = Accountant("rdp")
    times: dict[str, list[float]] = {"cached": [], "uncached": []}
    for _ in range(repeats):
        accountant.step(1.0, 0.064, 50)  # one task's steps, as a client's history grows
        steps = accountant.steps
        began = time.perf_counter()
        accountant.epsilon(1e-5)
        times["cached"].append((time.perf_counter() - began) * 1e3)
        began = time.perf_counter()
        _uncached_epsilon(1.0, 0.064, steps, 1e-5)
        times["uncached"].append((time.perf_counter() - began) * 1e3)
    cached_ms = statistics.median(times["cached"][1:])  # the first call fills the cache
    uncached_ms = statistics.median(times["uncached"][1:])
    return {"epsilon_call_ms": cached_ms, "epsilon_call_ms_uncached": uncached_ms,
            "epsilon_call_speedup": uncached_ms / cached_ms,
            "epsilon_max_abs_diff": diff}


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    started = time.monotonic()
    figures: dict[str, Any] = {}
    figures.update(step_times(steps=50, repeats=20 if args.quick else 40))
    figures.update(epsilon_costs(repeats=10 if args.quick else 30))
    with tempfile.TemporaryDirectory() as tmp:
        figures.update(user_level(rounds=8 if args.quick else 30, out=Path(tmp)))
        figures.update(sample_level(rounds=4 if args.quick else 15, out=Path(tmp)))
    figures["benchmark_seconds"] = time.monotonic() - started
    report(figures, args.json)


if __name__ == "__main__":
    main()
