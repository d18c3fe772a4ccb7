"""The SVG plot writer: well-formed documents whose shapes sit where the data says, with ticks
that span the data, escaped text, and no division by zero on one point, a constant series or
no data at all."""

from __future__ import annotations

import itertools
import math
import xml.etree.ElementTree as ET

import pytest

from fedlink.metrics.svg import (
    BarPanel,
    Series,
    heatmap,
    histogram,
    line_plot,
    nice_ticks,
    stacked_bars,
    tick_label,
)

NS = "{http://www.w3.org/2000/svg}"


def _parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == f"{NS}svg"
    return root


def _areas(root: ET.Element) -> list[tuple[float, float, float, float]]:
    """Each plot area's (left, top, width, height)."""
    return [tuple(float(r.get(k, "nan")) for k in ("x", "y", "width", "height"))  # type: ignore[misc]
            for r in root.iter(f"{NS}rect") if r.get("class") == "plot-area"]


def _ticks(root: ET.Element) -> list[str]:
    return [t.text or "" for t in root.iter(f"{NS}text") if t.get("class") == "tick"]


def _axis_ticks(root: ET.Element, axis: str) -> list[float]:
    """The x (centred under the axes) or y (right-aligned beside them) tick values."""
    anchor = "middle" if axis == "x" else "end"
    return [float(t.text or "nan") for t in root.iter(f"{NS}text")
            if t.get("class") == "tick" and t.get("text-anchor") == anchor]


def _texts(root: ET.Element) -> list[str]:
    return [t.text or "" for t in root.iter(f"{NS}text")]


def _points(line: ET.Element) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in
            (pair.split(",") for pair in (line.get("points") or "").split())]


def _series(root: ET.Element) -> list[ET.Element]:
    return [p for p in root.iter(f"{NS}polyline") if p.get("class") == "series"]


def test_a_known_point_lands_where_the_axes_put_it() -> None:
    root = _parse(line_plot([Series([0.0, 5.0, 10.0], [0.0, 0.5, 1.0])],
                            title="t", xlabel="x", ylabel="y"))
    (left, top, width, height), = _areas(root)
    xs, ys = _axis_ticks(root, "x"), _axis_ticks(root, "y")
    assert xs[0] == 0.0 and xs[-1] == 10.0 and ys[0] == 0.0 and ys[-1] == 1.0
    (line,) = _series(root)
    first, middle, last = _points(line)
    assert first == pytest.approx((left, top + height), abs=0.01)  # (0, 0): bottom left
    assert middle == pytest.approx((left + width / 2, top + height / 2), abs=0.01)
    assert last == pytest.approx((left + width, top), abs=0.01)  # (10, 1): top right


def test_ticks_cover_the_data_and_are_round() -> None:
    for low, high in [(0.3, 0.93), (1.0, 200.0), (-1234.5, 98765.4), (0.0, 3600.0),
                      (1e-5, 3e-5), (7.0, 7.0)]:
        ticks = nice_ticks(low, high)
        assert ticks[0] <= low and ticks[-1] >= high and len(ticks) >= 2
        steps = {round(b - a, 12) for a, b in itertools.pairwise(ticks)}
        assert len(steps) == 1  # evenly spaced
        step = steps.pop()
        assert round(step / 10 ** math.floor(math.log10(step)), 9) in (1, 2, 2.5, 5)
    assert nice_ticks(1, 10, integer=True) == [0, 2, 4, 6, 8, 10]
    assert [tick_label(t, [0.0, 0.25]) for t in (0.0, 0.25, 1.0)] == ["0", "0.25", "1.00"]


def test_labels_and_titles_are_present_and_escaped() -> None:
    svg = line_plot([Series([1, 2], [3, 4], label="a < b & c")], title="Loss <&> \"x\"",
                    xlabel="model time (hours)", ylabel="loss & accuracy",
                    hlines=[(3.5, "target <1>")])
    assert "a &lt; b &amp; c" in svg and "Loss &lt;&amp;&gt;" in svg
    texts = _texts(_parse(svg))
    for text in ("a < b & c", 'Loss <&> "x"', "model time (hours)", "loss & accuracy",
                 "target <1>"):
        assert text in texts


def test_missing_values_break_the_line_and_are_not_drawn() -> None:
    root = _parse(line_plot([Series([1, 2, 3, 4, 5], [0.1, None, float("nan"), 0.4, 0.5])],
                            title="t", xlabel="x", ylabel="y"))
    lines = _series(root)
    assert [len(_points(line)) for line in lines] == [2]  # 4-5; 1 stands alone
    markers = [c for c in root.iter(f"{NS}circle")]
    assert len(markers) == 3
    assert all(math.isfinite(float(c.get("cx", "nan"))) for c in markers)


@pytest.mark.parametrize("series", [
    Series([], []),                      # no data
    Series([3.0], [0.5]),                # one point
    Series([1, 2, 3], [0.7, 0.7, 0.7]),  # constant
    Series([None, None], [None, 1.0]),   # nothing usable
])
def test_degenerate_series_make_a_plot_without_dividing_by_zero(series: Series) -> None:
    root = _parse(line_plot([series], title="t", xlabel="x", ylabel="y"))
    (left, top, width, height), = _areas(root)
    assert width > 0 and height > 0
    for circle in root.iter(f"{NS}circle"):
        x, y = float(circle.get("cx", "nan")), float(circle.get("cy", "nan"))
        assert left <= x <= left + width and top <= y <= top + height


def test_a_legend_is_drawn_only_for_named_series() -> None:
    plain = _parse(line_plot([Series([1, 2], [1, 2])], title="t", xlabel="x", ylabel="y"))
    assert not [g for g in plain.iter(f"{NS}g") if g.get("class") == "legend"]
    named = _parse(line_plot([Series([1, 2], [1, 2], label="central"),
                              Series([1, 2], [2, 1], label="federated", marker="square")],
                             title="t", xlabel="x", ylabel="y"))
    (legend,) = [g for g in named.iter(f"{NS}g") if g.get("class") == "legend"]
    assert [t.text for t in legend.iter(f"{NS}text")] == ["central", "federated"]
    assert int(named.get("height", "0")) > int(plain.get("height", "0"))  # room below


def test_stacked_bars_stack_each_layer_on_the_last() -> None:
    root = _parse(stacked_bars(
        [BarPanel("per round", ["1", "2"], [[0.25, None], [0.75, 1.0]], ylabel="share"),
         BarPanel("per profile", ["wifi"], [[0.5], [0.5]])],
        ["communication", "compute"], colors=["#ff7f0e", "#1f77b4"], y_range=(0.0, 1.0)))
    areas = _areas(root)
    assert len(areas) == 2
    left, top, width, height = areas[0]
    bars = [r for r in root.iter(f"{NS}rect") if r.get("class") == "bar"]
    first = [b for b in bars if float(b.get("x", "0")) < left + width / 2]
    comm, compute = (b for b in first if b.get("fill") in ("#ff7f0e", "#1f77b4"))
    assert float(comm.get("y", "0")) + float(comm.get("height", "0")) == \
        pytest.approx(top + height, abs=0.01)  # from 0 ...
    assert float(comm.get("height", "0")) == pytest.approx(0.25 * height, abs=0.01)
    assert float(compute.get("y", "0")) == pytest.approx(top, abs=0.01)  # ... up to 1
    assert "per round" in _texts(root) and "communication" in _texts(root)
    assert {"1", "2", "wifi"} <= set(_ticks(root))


def test_many_categories_are_turned() -> None:
    root = _parse(stacked_bars([BarPanel("rounds", [str(i) for i in range(12)],
                                         [[0.5] * 12, [0.5] * 12])], ["a", "b"]))
    turned = [t.text for t in root.iter(f"{NS}text")
              if "rotate(-45" in (t.get("transform") or "")]
    assert turned == [str(i) for i in range(12)]


def test_a_histogram_counts_values_into_their_bins() -> None:
    root = _parse(histogram([0.05, 0.1, 0.15, 0.95, 1.0, None, float("nan"), 2.0], bins=10,
                            value_range=(0.0, 1.0), title="t", xlabel="accuracy",
                            ylabel="clients"))
    (left, _top, width, height), = _areas(root)
    ys = _axis_ticks(root, "y")
    bars = sorted((float(b.get("x", "0")), float(b.get("height", "0")))
                   for b in root.iter(f"{NS}rect") if b.get("class") == "bar")
    assert len(bars) == 3  # bins 0, 1, 9: 1, 2 and 2 values (1.0 falls in the last)
    per_count = height / (ys[-1] - ys[0])
    assert [round(h / per_count) for _, h in bars] == [1, 2, 2]
    assert bars[0][0] == pytest.approx(left, abs=0.01)
    assert bars[2][0] == pytest.approx(left + 0.9 * width, abs=0.01)
    assert ys == [float(int(y)) for y in ys]  # whole counts
    _parse(histogram([], bins=5, value_range=(0.0, 1.0), title="t", xlabel="x", ylabel="y"))


def test_a_heatmap_colours_cells_from_low_to_high_with_its_scale() -> None:
    root = _parse(heatmap([[0, 5], [10, 5]], title="Labels per client", xlabel="class",
                          ylabel="client", scale_label="examples"))
    (left, top, _width, height), = _areas(root)
    cells = {(float(r.get("x", "0")), float(r.get("y", "0"))): r.get("fill")
             for r in root.iter(f"{NS}rect") if r.get("class") == "bar"}
    assert len(cells) == 4
    assert cells[(left, top)] == "#440154"  # row 0, class 0: the lowest count, on top
    assert cells[(left, top + height / 2)] == "#fde725"  # row 1, class 0: the highest
    assert [r for r in root.iter(f"{NS}rect") if r.get("class") == "colour-scale"]
    assert "examples" in _texts(root) and "Labels per client" in _texts(root)
    _parse(heatmap([[3, 3]], title="t", xlabel="x", ylabel="y", scale_label="s"))  # constant
    _parse(heatmap([], title="t", xlabel="x", ylabel="y", scale_label="s"))  # empty


def test_wide_tick_labels_stay_inside_the_image() -> None:
    """Fixed margins: the longest y tick label (at about 0.6 em a character) starts right of
    the y axis label, which is inside the image."""
    for ys in ([0.1234, 0.9876], [-1234.5, 98765.4], [0.0, 2.5e7], [1e-5, 3e-5]):
        root = _parse(line_plot([Series([0, 1], ys)], title="t", xlabel="x", ylabel="y"))
        (left, *_), = _areas(root)
        widest = max(len(label) for label in _ticks(root)) * 0.6 * 11
        y_label = next(float(t.get("x", "nan")) for t in root.iter(f"{NS}text")
                       if t.text == "y")
        assert left - 7 - widest > y_label + 4  # clear of the turned y label's descent
        assert y_label - 12 > 0  # and the y label (font size 12) inside the image
