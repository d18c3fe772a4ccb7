"""FedProx vs FedAvg under 90% stragglers (Li et al. 2020, Figure 1), both in one go.

Runs ``examples/synthetic_fedprox.toml`` (Synthetic(1, 1), 30 devices, 10 per round, 20 local
epochs, lr 0.01, batch 10, logistic regression, 90% of tasks done only for 1..20 epochs) as:

- **FedAvg**: the coordinator drops every partial update (``drop_partial = true``, ``mu = 0``);
- **FedProx**: it keeps them, weighted by their work fraction, with ``mu = 1``;
- with ``--mu0`` also FedProx with ``mu = 0`` (partial work kept, no proximal term).

Every variant sees the same stragglers doing the same amounts of work (the draws are seeded per
client and task). The report, ``<output>/report.md``, shows the training loss over all devices
and the test accuracy per round for every variant in one figure (``curves.png``) and a table of
the final numbers; each variant's own run folder (events, summary, report) is beside it.

Run:  python examples/fedprox_stragglers.py [--rounds N] [--mu0] [--output-dir DIR]
"""

from __future__ import annotations

import argparse
import copy
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from fedlink.config import load_toml
from fedlink.metrics.events import read_events
from fedlink.sim import ExperimentConfig, run_simulation

HERE = Path(__file__).resolve().parent
CONFIG = HERE / "synthetic_fedprox.toml"
OUTPUT = Path("runs") / "fedprox-compare"
PLOT = "curves.png"
LAST = 5
"""Rounds averaged for the "last rounds" columns (the FedAvg curve is noisy)."""


@dataclass(frozen=True)
class Variant:
    """How the coordinator treats partial work, and the proximal coefficient."""

    key: str
    label: str
    drop_partial: bool
    mu: float


FEDAVG = Variant("fedavg-drop", "FedAvg: stragglers dropped, mu = 0", True, 0.0)
FEDPROX = Variant("fedprox-mu1", "FedProx: partial work kept, mu = 1", False, 1.0)
FEDPROX_MU0 = Variant("fedprox-mu0", "FedProx: partial work kept, mu = 0", False, 0.0)


@dataclass(frozen=True)
class Outcome:
    """One variant's curves (per model version) and counts."""

    variant: Variant
    rounds: list[int]
    train_loss: list[float]
    accuracy: list[float]
    accepted: int
    dropped: int
    seconds: float

    def final(self) -> dict[str, float]:
        """Final and last-``LAST``-round mean figures."""
        tail = slice(-min(LAST, len(self.rounds)), None)
        return {
            "train_loss": self.train_loss[-1],
            "accuracy": self.accuracy[-1],
            "train_loss_last": _mean(self.train_loss[tail]),
            "accuracy_last": _mean(self.accuracy[tail]),
        }


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def variant_table(base: dict[str, Any], variant: Variant, rounds: int | None) -> dict[str, Any]:
    """``base`` (a parsed experiment TOML) set up as ``variant``."""
    table = copy.deepcopy(base)
    table.setdefault("run", {})["name"] = variant.key
    table["run"]["evaluate_train"] = True
    coordinator = table.setdefault("coordinator", {})
    coordinator["drop_partial"] = variant.drop_partial
    if rounds is not None:
        coordinator["rounds"] = rounds
    training = coordinator.setdefault("training", {})
    training["trainer_options"] = {**training.get("trainer_options", {}), "prox_mu": variant.mu}
    return table


def run_variant(base: dict[str, Any], variant: Variant, output: Path, rounds: int | None,
                progress: bool) -> Outcome:
    """Simulate one variant; its run folder is ``output/<variant.key>``."""
    config = ExperimentConfig.from_dict(variant_table(base, variant, rounds),
                                        base_dir=CONFIG.parent)
    started = time.monotonic()
    result = run_simulation(config, output, progress=progress)
    seconds = time.monotonic() - started
    events = read_events(result.run_dir / "events.jsonl")
    flushes = [e for e in events if e["kind"] == "flush"]
    dropped = sum(1 for e in events if e["kind"] == "update_refused"
                  and "drop_partial" in str(e.get("reason", "")))
    return Outcome(variant, [int(e["model_version"]) for e in flushes],
                   [float(e["train_loss"]) for e in flushes],
                   [float(e["accuracy"]) for e in flushes],
                   sum(1 for e in events if e["kind"] == "update_accepted"), dropped, seconds)


def plot(outcomes: Sequence[Outcome], path: Path) -> None:
    """Training loss and test accuracy per round, every variant on the same two axes."""
    figure = Figure(figsize=(11, 4.2))
    FigureCanvasAgg(figure)
    loss_axes, accuracy_axes = figure.subplots(1, 2)
    for outcome in outcomes:
        loss_axes.plot(outcome.rounds, outcome.train_loss, label=outcome.variant.label)
        accuracy_axes.plot(outcome.rounds, outcome.accuracy, label=outcome.variant.label)
    loss_axes.set(title="Training loss (all devices)", xlabel="round", ylabel="loss")
    accuracy_axes.set(title="Test accuracy", xlabel="round", ylabel="accuracy")
    for axes in (loss_axes, accuracy_axes):
        axes.grid(alpha=0.3)
    loss_axes.legend()
    figure.suptitle("Synthetic(1, 1), 90% stragglers")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def write_report(outcomes: Sequence[Outcome], output: Path, base: dict[str, Any]) -> Path:
    """``output/report.md``: set-up, the figure and the table of final numbers."""
    plot(outcomes, output / PLOT)
    training = base.get("coordinator", {}).get("training", {})
    fraction = base.get("partial_work", {}).get("fraction", 0.0)
    rounds = max(len(o.rounds) for o in outcomes)
    lines = [
        "# FedProx vs FedAvg with stragglers (FedProx paper, Figure 1)",
        "",
        f"Synthetic(1, 1), {base['data']['clients']} devices, "
        f"{base['coordinator']['flush'].get('goal')} per round (synchronous), "
        f"{training.get('local_epochs')} local epochs, lr {training.get('learning_rate')}, "
        f"batch {training.get('batch_size')}, multinomial logistic regression, {rounds} rounds. "
        f"{fraction:.0%} of the tasks are stragglers' doing a uniformly random 1..E of the "
        "E epochs (seeded: every variant sees the same draws). FedAvg drops their updates "
        "(`drop_partial = true`); FedProx keeps them, weighted by work fraction.",
        "",
        f"![training loss and test accuracy per round]({PLOT})",
        "",
        f"| variant | final train loss | final test accuracy | train loss, last {LAST} "
        f"| test accuracy, last {LAST} | updates used | dropped | seconds |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for outcome in outcomes:
        final = outcome.final()
        lines.append(
            f"| {outcome.variant.label} | {final['train_loss']:.4f} | {final['accuracy']:.4f} "
            f"| {final['train_loss_last']:.4f} | {final['accuracy_last']:.4f} "
            f"| {outcome.accepted} | {outcome.dropped} | {outcome.seconds:.1f} |")
    lines += ["", "Each variant's own run folder (events.jsonl, summary.json, report.md) is "
              "in this folder, named by its key: "
              + ", ".join(f"`{o.variant.key}/`" for o in outcomes) + ".", ""]
    path = output / "report.md"
    path.write_text("\n".join(lines))
    return path


def compare(config: Path = CONFIG, output: Path = OUTPUT, rounds: int | None = None,
            variants: Sequence[Variant] = (FEDAVG, FEDPROX),
            progress: bool = True) -> tuple[list[Outcome], Path]:
    """Run every variant of ``config`` and write the comparison report; (outcomes, report)."""
    output.mkdir(parents=True, exist_ok=True)
    base = load_toml(config)
    outcomes = [run_variant(base, v, output, rounds, progress) for v in variants]
    return outcomes, write_report(outcomes, output, base)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=CONFIG, help="experiment TOML")
    parser.add_argument("--rounds", type=int, default=None, help="override [coordinator] rounds")
    parser.add_argument("--output-dir", type=Path, default=OUTPUT, help="report folder")
    parser.add_argument("--mu0", action="store_true",
                        help="also run FedProx with mu = 0 (partial work kept, no prox term)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    # FedAvg refuses most updates on purpose; one warning per refusal would drown the output.
    logging.getLogger("fedlink.client.session").setLevel(logging.ERROR)
    variants = (FEDAVG, FEDPROX_MU0, FEDPROX) if args.mu0 else (FEDAVG, FEDPROX)
    outcomes, report = compare(args.config, args.output_dir, args.rounds, variants,
                               not args.no_progress)
    for outcome in outcomes:
        final = outcome.final()
        print(f"{outcome.variant.label:<40} train loss {final['train_loss']:.4f}  "
              f"test accuracy {final['accuracy']:.4f}")
    print(f"report: {report}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
