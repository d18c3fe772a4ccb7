"""The report's line plots are drawn at fixed margins (no layout engine): their title, tick
labels and axis labels must still fall inside the image, for the values a run reports."""

from __future__ import annotations

import pytest

from fedlink.metrics.canvas import line_axes


@pytest.mark.parametrize(("x", "y"), [
    ([1, 2, 3, 200], [0.1234, 0.5, 0.9876, 1.0]),  # accuracy by model version
    ([0.0, 3_600.0, 86_400.0], [2.3456, 1.2, 0.35]),  # loss over a day of model seconds
    ([0.0, 0.5, 1.0], [-1_234.5, 0.0, 98_765.4]),  # a user's metric with wide values
])
def test_a_line_plot_keeps_its_labels_inside_the_figure(x: list[float], y: list[float]) -> None:
    fig, ax = line_axes()
    ax.plot(x, y, marker="o")
    ax.set(title="Accuracy vs model time", xlabel="model time of the fleet (hours)",
           ylabel="accuracy")
    box = ax.get_tightbbox(fig.canvas.get_renderer())
    assert box is not None
    assert box.x0 >= 0 and box.y0 >= 0
    assert box.x1 <= fig.bbox.width and box.y1 <= fig.bbox.height
