"""Model time in the summary and the report: how long a real fleet would have taken.

A virtual-clock run (``[run] mode = "virtual"``) stamps each event's ``elapsed`` in model
seconds, the time a fleet on the modelled links and devices would have taken, while the
event's ``t`` stays wall-clock time; each ``flush`` carries ``model_seconds`` and the summary
``model_seconds`` and ``simulation_seconds`` (wall). Its summary also holds, from
:func:`time_shares`:

===================== =======================================================================
``time_by_round``     one entry per round: ``round``, ``model_version`` (the version its tasks
                      trained on: round ``v + 1``), ``tasks``, ``network_s`` (model seconds
                      downloading, uploading and committing, round trips included),
                      ``compute_s`` (model seconds training) and ``comm_share``
                      (``network_s`` over both; None when both are 0)
``time_by_profile``   link profile name -> the same fields but ``round``/``model_version``
===================== =======================================================================

Every task the run started is counted once, in the round of its model and in its client's
profile (accepted, refused, lost or still in flight at the end): each table adds up to the
summary's ``client_network_seconds`` and ``client_train_seconds``. An evaluation task's
network time is in its client's profile and the round of the version it evaluated, but
``tasks`` counts training tasks only. Time a client spent offline, its work paused, is in
neither.

:func:`model_time_figures` gives ``accuracy_by_time``: per flush with ``model_seconds``, its
``model_version``, ``accuracy`` (None without evaluation), ``model_seconds`` and
``simulation_seconds`` (wall seconds since the log's first event). :func:`draw_model_time`
plots accuracy against both and the communication/compute split per round and per profile
(SVG, :mod:`fedlink.metrics.svg`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedlink.metrics.events import Event
from fedlink.metrics.svg import BarPanel, Series, line_plot, stacked_bars, write_svg

ACCURACY_VS_MODEL_TIME = "accuracy_vs_model_time.svg"
ACCURACY_VS_SIMULATION_TIME = "accuracy_vs_simulation_time.svg"
TIME_SHARES = "comm_vs_compute.svg"
PLOTS = (ACCURACY_VS_MODEL_TIME, ACCURACY_VS_SIMULATION_TIME, TIME_SHARES)
"""The plots ``draw_model_time`` may draw."""

_UNITS = ((7200.0, 3600.0, "hours"), (120.0, 60.0, "minutes"), (0.0, 1.0, "seconds"))
"""(span from which a unit is used, seconds per unit, its name), longest first."""


def time_shares(per_round: Mapping[int, Mapping[str, float]],
                per_profile: Mapping[str, Mapping[str, float]]) -> dict[str, Any]:
    """``time_by_round`` and ``time_by_profile`` (see the module docstring) from the rows a
    virtual loop kept: ``{"tasks", "network_s", "compute_s"}`` by model version and by
    profile."""
    rounds = [{"round": version + 1, "model_version": version, **_with_share(row)}
              for version, row in sorted(per_round.items())]
    profiles = {name: _with_share(row) for name, row in sorted(per_profile.items())}
    return {"time_by_round": rounds, "time_by_profile": profiles}


def _with_share(row: Mapping[str, float]) -> dict[str, Any]:
    network, compute = float(row.get("network_s", 0.0)), float(row.get("compute_s", 0.0))
    total = network + compute
    return {"tasks": int(row.get("tasks", 0)), "network_s": network, "compute_s": compute,
            "comm_share": network / total if total > 0 else None}


def model_time_figures(events: Sequence[Event], flushes: Sequence[Event]) -> dict[str, Any]:
    """``{"accuracy_by_time": ...}`` for flushes that carry model time; empty for a run
    without (real time: its ``elapsed`` is already wall-clock)."""
    timed = [e for e in flushes if e.get("model_seconds") is not None]
    if not timed or not events:
        return {}
    start = float(events[0]["t"])
    return {"accuracy_by_time": {
        "model_version": [e.get("model_version") for e in timed],
        "accuracy": [None if e.get("accuracy") is None else float(e["accuracy"])
                     for e in timed],
        "model_seconds": [float(e["model_seconds"]) for e in timed],
        "simulation_seconds": [max(0.0, float(e["t"]) - start) for e in timed],
    }}


def time_unit(seconds: Sequence[float]) -> tuple[float, str]:
    """(seconds per unit, unit name) to show durations spanning up to ``max(seconds)``:
    hours from two hours on, minutes from two minutes, else seconds."""
    span = max(seconds, default=0.0)
    return next((size, name) for least, size, name in _UNITS if span >= least)


def draw_model_time(run_dir: Path, summary: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Draw the model-time plots the summary supports into ``run_dir``; their
    ``(title, file name)``s (none for a run without model time)."""
    drawn: list[tuple[str, str]] = []
    curve = summary.get("accuracy_by_time") or {}
    points = [(m, w, a) for m, w, a in zip(curve.get("model_seconds", ()),
                                           curve.get("simulation_seconds", ()),
                                           curve.get("accuracy", ()), strict=True)
              if a is not None]
    if points:
        drawn.append(_accuracy_plot(run_dir / ACCURACY_VS_MODEL_TIME, "Accuracy vs model time",
                                    [p[0] for p in points], [p[2] for p in points],
                                    "model time of the fleet"))
        drawn.append(_accuracy_plot(run_dir / ACCURACY_VS_SIMULATION_TIME,
                                    "Accuracy vs simulation wall time",
                                    [p[1] for p in points], [p[2] for p in points],
                                    "wall time of the simulation"))
    rounds = summary.get("time_by_round") or []
    profiles = summary.get("time_by_profile") or {}
    if rounds or profiles:
        _shares_plot(run_dir / TIME_SHARES, rounds, profiles)
        drawn.append(("Communication and compute share of model time", TIME_SHARES))
    return drawn


def _accuracy_plot(path: Path, title: str, seconds: list[float], accuracy: list[float],
                   what: str) -> tuple[str, str]:
    size, unit = time_unit(seconds)
    write_svg(path, line_plot([Series([s / size for s in seconds], list(accuracy))],
                              title=title, xlabel=f"{what} ({unit})", ylabel="accuracy"))
    return title, path.name


def _shares_plot(path: Path, rounds: Sequence[Mapping[str, Any]],
                 profiles: Mapping[str, Mapping[str, Any]]) -> None:
    """Stacked bars: the communication and compute share of model time, per round (left) and
    per link profile (right)."""
    groups = (("per round", [str(r["round"]) for r in rounds], list(rounds),
               "round (the model version its tasks trained on, + 1)"),
              ("per link profile", list(profiles), list(profiles.values()), "link profile"))
    panels = []
    for title, labels, rows, xlabel in groups:
        shares = [row.get("comm_share") for row in rows]  # None: no time, no bar
        panels.append(BarPanel(
            f"Share of model time, {title}", labels,
            [[None if s is None else float(s) for s in shares],
             [None if s is None else 1.0 - float(s) for s in shares]],
            xlabel=xlabel, ylabel="share"))
    write_svg(path, stacked_bars(panels, ["communication", "compute"],
                                 colors=["#ff7f0e", "#1f77b4"], y_range=(0.0, 1.0)))
