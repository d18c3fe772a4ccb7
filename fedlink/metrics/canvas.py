"""The figure a report's line plot is drawn on: a bare ``Figure`` with an Agg canvas (no
display, no global pyplot state) and one axes at fixed margins.

Fixed margins, not matplotlib's constrained layout: the layout engine measures every tick label
and title in an extra drawing pass, about a third of what a line plot costs to write, and a
small run's report is several such plots. A line plot's labels (short tick numbers, one-line
axis labels and title) fit these margins; plots with legends beside the axes or rotated labels
keep the layout engine.
"""

from __future__ import annotations

from typing import Any

MARGINS = {"left": 0.14, "right": 0.97, "bottom": 0.12, "top": 0.92}
"""Fractions of the figure around the axes: room for the y tick labels and label on the left,
the x ones below and the title above."""


def line_axes(width: float = 6.4, height: float = 4.0) -> tuple[Any, Any]:
    """(figure, axes) for one line plot of ``width`` x ``height`` inches."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    fig.subplots_adjust(**MARGINS)
    return fig, fig.add_subplot()
