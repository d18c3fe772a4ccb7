"""Human-readable formatting of run figures, shared by the report and the console."""

from __future__ import annotations

import math
from typing import Any

_BYTE_UNITS = ("B", "kB", "MB", "GB", "TB", "PB", "EB")


def human_bytes(n: float) -> str:
    """Format a byte count with SI (powers of 1000) units: ``532 B``, ``1.2 MB``, ``3.0 GB``.

    Raises ``ValueError`` for negative or non-finite counts.
    """
    if not math.isfinite(n) or n < 0:
        raise ValueError(f"not a byte count: {n!r}")
    if n < 1000:
        return f"{int(n)} B"
    value = float(n)
    for unit in _BYTE_UNITS[1:]:
        value /= 1000.0
        if round(value, 1) < 1000 or unit == _BYTE_UNITS[-1]:
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable")


def human_seconds(seconds: float | None) -> str:
    """Format a duration: ``0.42 s``, ``12.3 s``, ``4m 05s``, ``2h 03m``; None gives ``-``."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60}m {whole % 60:02d}s"
    return f"{whole // 3600}h {whole % 3600 // 60:02d}m"


def fmt_metric(value: float | None, digits: int = 4) -> str:
    """Format an accuracy or loss to ``digits`` decimals; None gives ``-``."""
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:.{digits}f}"


def key_figures(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """The headline figures of a run summary as ``(label, formatted value)`` rows."""
    return [
        ("Final accuracy", fmt_metric(summary.get("final_accuracy"))),
        ("Best accuracy", fmt_metric(summary.get("best_accuracy"))),
        ("Final loss", fmt_metric(summary.get("final_loss"))),
        ("Rounds", str(summary.get("rounds", 0))),
        ("Ended", str(summary.get("finish_reason") or "without finishing")),
        ("Wall time", human_seconds(summary.get("wall_seconds"))),
        *([("Model time", human_seconds(summary["model_seconds"]))]
          if summary.get("model_seconds") is not None else []),
        ("Clients", str(summary.get("clients", 0))),
        ("Updates accepted", str(summary.get("updates_accepted", 0))),
        ("Updates refused", str(summary.get("updates_refused", 0))),
        ("Bytes up", human_bytes(summary.get("bytes_up", 0))),
        ("Bytes down", human_bytes(summary.get("bytes_down", 0))),
        *([("Bytes down wasted", human_bytes(summary["bytes_down_wasted"]))]
          if summary.get("bytes_down_wasted") else []),
        *([("Central evaluation FAILED", f"{summary['evaluation_errors']} flushes: "
            f"{summary.get('evaluation_error')}")] if summary.get("evaluation_errors") else []),
        *([("Kept-local tensors", f"{len(summary['kept_local']['tensors'])}, in the central "
            f"model: {summary['kept_local']['filled_with']}")]
          if isinstance(summary.get("kept_local"), dict) else []),
        *([("WARNING", str(summary["warning"]))] if summary.get("warning") else []),
    ]
