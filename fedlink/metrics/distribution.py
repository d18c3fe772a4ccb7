"""The label-distribution plot: how the partition spread the classes over the clients.

``label_distribution(counts)`` is what a run records in ``summary.json`` (a clients x classes
matrix of example counts, the first ``MAX_CLIENTS`` clients); ``draw_label_distribution``
renders it as an SVG heatmap for the report. Non-IID splits (Dirichlet, k classes per client,
natural writers) are easier to judge seen than described.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedlink.metrics.svg import heatmap, write_svg

LABEL_PLOT = "label_distribution.svg"
MAX_CLIENTS = 100
"""Clients recorded and drawn (a heatmap of a million rows says nothing)."""


def label_distribution(counts: Sequence[Sequence[int]]) -> dict[str, Any]:
    """The summary entry for per-client label counts (``counts[client][label]``)."""
    rows = [[int(v) for v in row] for row in counts[:MAX_CLIENTS]]
    return {"clients": len(counts), "shown": len(rows), "counts": rows}


def draw_label_distribution(run_dir: Path, entry: Mapping[str, Any]) -> str | None:
    """Draw ``entry`` (from ``label_distribution``) into ``run_dir``; the file name, or
    ``None`` when there is nothing to draw."""
    rows = entry.get("counts") or []
    if not rows or not rows[0]:
        return None
    shown, total = entry.get("shown", len(rows)), entry.get("clients", len(rows))
    suffix = "" if shown == total else f" (first {shown} of {total})"
    height = round(100 * max(2.5, min(12.0, 0.18 * len(rows) + 1.5)))
    write_svg(run_dir / LABEL_PLOT, heatmap(rows, title=f"Labels per client{suffix}",
                                            xlabel="class", ylabel="client",
                                            scale_label="examples", height=height))
    return LABEL_PLOT


def label_section(filename: str | None) -> str:
    """The report's section for the plot (empty when there is none)."""
    if filename is None:
        return ""
    return f"## Label distribution\n\n![Labels per client]({filename})"
