"""Federated evaluation in the summary and the report: the global model scored on clients' data.

Clients given evaluation tasks (``fedlink.coordinator.evaluations``) score the global model of
a version on their own data and report it; each report is one ``evaluation_reported`` event
(``num_examples``, ``loss``, ``accuracy``). ``federated_figures`` weights them by examples per
model version (with the tasks issued for it, ``evaluation_issued``), next to the central
test-set curve of ``flush`` events, and keeps the per-client accuracies of the last evaluated
version: their spread is a fairness question a mean hides. ``draw_federated`` plots both
(SVG).
Runs written before evaluation tasks existed (``fed_eval_*`` metrics riding on
``update_accepted``) still read.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fedlink.metrics.events import Event
from fedlink.metrics.svg import Series, histogram, line_plot, write_svg

CURVES_PLOT = "federated_vs_central.svg"
SPREAD_PLOT = "client_accuracy.svg"
_OLD_PREFIX = "fed_eval_"  # how runs before evaluation tasks reported, with their updates


def _row(event: Event) -> tuple[int, dict[str, float]] | None:
    """``(version, {"examples", "loss", "accuracy"})`` of one evaluation, or ``None``."""
    if event.get("kind") == "evaluation_reported" and event.get("num_examples"):
        scores = {"examples": float(event["num_examples"])}
        scores.update({k: float(event[k]) for k in ("loss", "accuracy")
                       if event.get(k) is not None})
        return int(event["model_version"]), scores
    metrics = event.get("client_metrics") or {}
    if event.get("kind") == "update_accepted" and metrics.get(f"{_OLD_PREFIX}examples"):
        return int(event["base_version"]), {k.removeprefix(_OLD_PREFIX): float(v)
                                            for k, v in metrics.items()
                                            if k.startswith(_OLD_PREFIX)}
    return None


def _evaluations(events: Iterable[Event]) -> dict[int, list[Mapping[str, float]]]:
    """Each version's client evaluations, in version order."""
    by_version: dict[int, list[Mapping[str, float]]] = defaultdict(list)
    for event in events:
        row = _row(event)
        if row is not None:
            by_version[row[0]].append(row[1])
    return dict(sorted(by_version.items()))


def _weighted(rows: list[Mapping[str, float]], key: str) -> float | None:
    """The example-weighted mean of ``key`` over the rows that have it."""
    pairs = [(float(r[key]), float(r["examples"])) for r in rows if key in r]
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if total else None


def federated_figures(events: list[Event]) -> dict[str, Any]:
    """Summary entries for a run with federated evaluation (empty without any)."""
    by_version = _evaluations(events)
    if not by_version:
        return {}
    versions = list(by_version)
    last = by_version[versions[-1]]
    curve: dict[str, Any] = {
        "versions": versions,
        "accuracy": [_weighted(rows, "accuracy") for rows in by_version.values()],
        "loss": [_weighted(rows, "loss") for rows in by_version.values()],
        "clients": [len(rows) for rows in by_version.values()],
        "examples": [int(sum(r["examples"] for r in rows)) for rows in by_version.values()],
        "last_client_accuracies": sorted(float(r["accuracy"]) for r in last
                                         if "accuracy" in r),
    }
    issued = Counter(int(e["model_version"]) for e in events
                     if e.get("kind") == "evaluation_issued")
    if issued:  # tasks handed out per version: how many never reported (expired, too late)
        curve["issued"] = [issued[version] for version in versions]
    return {"federated_evaluation": curve, "final_federated_accuracy": curve["accuracy"][-1],
            "final_federated_loss": curve["loss"][-1]}


def draw_federated(run_dir: Path, events: list[Event], summary: Mapping[str, Any]) -> str:
    """Draw the curves and the per-client spread; the report's section ("" without any)."""
    curve = summary.get("federated_evaluation")
    if not curve or not any(a is not None for a in curve["accuracy"]):
        return ""
    central = [(float(e.get("model_version") or 0), float(e["accuracy"])) for e in events
               if e.get("kind") == "flush" and e.get("accuracy") is not None]
    points = [(float(v), float(a)) for v, a in zip(curve["versions"], curve["accuracy"],
                                                   strict=True) if a is not None]
    write_svg(run_dir / CURVES_PLOT, line_plot(
        [Series([v for v, _ in central], [a for _, a in central], label="central test set"),
         Series([v for v, _ in points], [a for _, a in points], marker="square",
                label="federated (clients' data, example-weighted)")],
        title="Central and federated accuracy", xlabel="model version", ylabel="accuracy"))
    spread = curve["last_client_accuracies"]
    write_svg(run_dir / SPREAD_PLOT, histogram(
        spread, bins=min(20, max(5, len(spread))), value_range=(0.0, 1.0),
        title=f"Per-client accuracy, version {curve['versions'][-1]} ({len(spread)} clients)",
        xlabel="accuracy of the global model on a client's data", ylabel="clients"))
    worst, best = (spread[0], spread[-1]) if spread else (float("nan"), float("nan"))
    scored_on = f" Scored on {curve['scored_on']}." if curve.get("scored_on") else ""
    return (f"## Federated evaluation\n\nThe global model scored on the data of the clients "
            f"given evaluation tasks, weighted by examples; at version {curve['versions'][-1]} "
            f"{len(spread)} clients ranged from {worst:.3f} to {best:.3f}.{scored_on}\n\n"
            f"![Central and federated accuracy]({CURVES_PLOT})\n\n"
            f"![Per-client accuracy]({SPREAD_PLOT})")
