"""A small SVG plot writer for the run report and ``fedlink compare``: line plots, stacked bars
in panels, a histogram and a heatmap, as SVG text with fixed sizes.

The report's plots are a handful of lines, bars and cells. Drawing them with a plotting library
cost a small run more than the run itself (importing it, then rendering pixels); writing the
same shapes as SVG elements is string formatting, needs no package and no display, and the
files stay sharp at any zoom in a browser or a Markdown viewer.

Every plot has the same anatomy: a white background, a title on top, one or more plot areas
(``<rect class="plot-area">``) with a grey frame, "nice" ticks (steps of 1, 2, 2.5 or 5 times a
power of ten) that span the data, light grid lines, axis labels, and, where series are named, a
legend below. A plot area's axes run from its first tick to its last, so a value ``v`` on the
x axis lands at ``left + (v - first) / (last - first) * width`` (y likewise, upwards). Missing
values (``None``, NaN, infinities) are left out: a line breaks around them. Text is escaped.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeGuard

from fedlink.private import touch_private

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")
"""Series colours, in order (the familiar ten-colour cycle)."""

VIRIDIS = ("#440154", "#472d7b", "#3b528b", "#2c728e", "#21918c", "#28ae80", "#5ec962",
           "#addc30", "#fde725")
"""The heatmap's colour scale, low to high, at even steps (interpolated in between)."""

FONT = "font-family=\"DejaVu Sans, Arial, Helvetica, sans-serif\""
LEFT = 80
"""Pixels left of a plot area: its y tick labels (up to seven characters) and the y label."""
_CHAR_W = 0.6
"""A character's width as a share of the font size: a conservative guess for placing text."""


@dataclass(frozen=True)
class Series:
    """One line of a line plot: its points (missing values skipped), legend label, marker
    (``"circle"``, ``"square"`` or ``""`` for none) and colour (the palette's next if empty)."""

    x: Sequence[float | None]
    y: Sequence[float | None]
    label: str = ""
    marker: str = "circle"
    color: str = ""
    dashed: bool = False


@dataclass(frozen=True)
class BarPanel:
    """One panel of stacked bars: a bar per category, ``stacks[layer][category]`` stacked
    bottom up (missing values count as 0)."""

    title: str
    categories: Sequence[str]
    stacks: Sequence[Sequence[float | None]]
    xlabel: str = ""
    ylabel: str = ""


def nice_ticks(low: float, high: float, count: int = 5, integer: bool = False) -> list[float]:
    """About ``count`` evenly spaced round values from at most ``low`` to at least ``high``
    (steps of 1, 2, 2.5 or 5 times a power of ten; whole steps with ``integer``). An empty or
    single-value range is widened around its value, so there are always two ticks or more."""
    if not (math.isfinite(low) and math.isfinite(high)):
        low, high = 0.0, 1.0
    low, high = min(low, high), max(low, high)
    if high - low < 1e-12 * max(1.0, abs(low), abs(high)):
        pad = 1.0 if integer or low == 0 else abs(low) * 0.1
        low, high = low - pad, high + pad
    raw = (high - low) / max(1, count - 1)
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1.0, 2.0, 2.5, 5.0, 10.0) if m * power >= raw * (1 - 1e-9))
    if integer:
        step = max(1.0, round(step))
    first, last = math.floor(low / step + 1e-9), math.ceil(high / step - 1e-9)
    return [_clean(i * step) for i in range(first, last + 1)]


def tick_label(value: float, ticks: Sequence[float]) -> str:
    """``value`` written with as many decimals as the step between ``ticks`` needs."""
    step = abs(ticks[1] - ticks[0]) if len(ticks) > 1 else abs(value) or 1.0
    biggest = max(abs(t) for t in ticks) if ticks else abs(value)
    if biggest >= 1e6 or step < 1e-4:
        return f"{value:.3g}"
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    if round(step * 10 ** decimals) % 1 or round(step * 10 ** (decimals + 1)) % 10:
        decimals += 1  # 2.5, 0.25: one more digit
    text = f"{value:.{decimals}f}"
    return "0" if float(text) == 0 else text


def line_plot(series: Sequence[Series], *, title: str, xlabel: str, ylabel: str,
              hlines: Sequence[tuple[float, str]] = (), width: int = 640,
              height: int = 400) -> str:
    """A line plot of ``series`` (with markers), optional dashed horizontal reference lines
    ``(y, label)``, and a legend below when any series or line has a label."""
    named = [s.label for s in series if s.label] + [label for _, label in hlines if label]
    canvas = _Canvas(width, height + _legend_height(len(named)), title)
    points = [p for s in series for p in _points(s) if p is not None]
    xs = [x for x, _ in points]
    ys = [y for _, y in points] + [float(y) for y, _ in hlines if _finite(y)]
    whole = bool(xs) and all(x == round(x) for x in xs)  # versions, rounds: whole ticks
    frame = _Frame(canvas, _Box(LEFT, 40, width - LEFT - 20, height - 100),
                   nice_ticks(*_span(xs), integer=whole), nice_ticks(*_span(ys)), xlabel,
                   ylabel)
    entries: list[tuple[str, str, str, bool]] = []
    for index, line in enumerate(series):
        color = line.color or PALETTE[index % len(PALETTE)]
        frame.line(_points(line), color, line.marker, line.dashed)
        if line.label:
            entries.append((line.label, color, line.marker, line.dashed))
    for value, label in hlines:
        if _finite(value):
            frame.hline(float(value), "#808080")
            if label:
                entries.append((label, "#808080", "", True))
    canvas.legend(entries, LEFT, height)
    return canvas.svg()


def stacked_bars(panels: Sequence[BarPanel], layers: Sequence[str], *, title: str = "",
                 colors: Sequence[str] = (), y_range: tuple[float, float] | None = None,
                 panel_width: int = 500, height: int = 400) -> str:
    """Panels side by side, each a stacked bar per category; ``layers`` names the stacked
    layers in the legend on top (coloured by ``colors``, else the palette). ``y_range`` fixes
    the value axis (a share: ``(0, 1)``); without it, it spans 0 to the tallest bar."""
    colors = list(colors) or list(PALETTE)
    canvas = _Canvas(panel_width * max(1, len(panels)), height, title)
    canvas.legend([(name, colors[i % len(colors)], "bar", False)
                   for i, name in enumerate(layers)], LEFT, 38, across=True)
    for index, panel in enumerate(panels):
        totals = [sum(_value(layer[i]) for layer in panel.stacks if i < len(layer))
                  for i in range(len(panel.categories))]
        low, high = y_range if y_range is not None else (0.0, max(totals, default=1.0) or 1.0)
        rotate = len(panel.categories) > 8
        box = _Box(index * panel_width + LEFT, 90, panel_width - LEFT - 20, height - (180 if rotate
                                                                            else 150))
        count = max(1, len(panel.categories))
        frame = _Frame(canvas, box, [-0.5, count - 0.5], nice_ticks(low, high), panel.xlabel,
                       panel.ylabel, title=panel.title, x_ticks=False)
        frame.categories(panel.categories, rotate)
        bottoms = [0.0] * count
        for layer_index, layer in enumerate(panel.stacks):
            color = colors[layer_index % len(colors)]
            for i, value in enumerate(list(layer)[:count]):
                frame.bar(i - 0.35, i + 0.35, bottoms[i], bottoms[i] + _value(value), color)
                bottoms[i] += _value(value)
    return canvas.svg()


def histogram(values: Iterable[float | None], *, bins: int, value_range: tuple[float, float],
              title: str, xlabel: str, ylabel: str, width: int = 640, height: int = 360) -> str:
    """A histogram of the finite ``values`` in ``bins`` equal bins over ``value_range`` (the
    last bin includes its upper edge; values outside are left out)."""
    low, high = value_range
    bins = max(1, int(bins))
    counts = [0] * bins
    for value in (float(v) for v in values if _finite(v)):
        if low <= value <= high and high > low:
            counts[min(bins - 1, int((value - low) / (high - low) * bins))] += 1
    canvas = _Canvas(width, height, title)
    frame = _Frame(canvas, _Box(LEFT, 40, width - LEFT - 20, height - 100), nice_ticks(low, high),
                   nice_ticks(0, max(counts, default=0) or 1, integer=True), xlabel, ylabel)
    edge = (high - low) / bins
    for i, count in enumerate(counts):
        if count:
            frame.bar(low + i * edge, low + (i + 1) * edge, 0.0, float(count), PALETTE[0])
    return canvas.svg()


def heatmap(rows: Sequence[Sequence[float]], *, title: str, xlabel: str, ylabel: str,
            scale_label: str, width: int = 640, height: int = 400) -> str:
    """``rows[r][c]`` as coloured cells (row 0 on top), the colour scale beside them with
    its ticks and label."""
    cols = max((len(r) for r in rows), default=0)
    values = [float(v) for r in rows for v in r if _finite(v)]
    low, high = _span(values) if values else (0.0, 1.0)
    canvas = _Canvas(width, height, title)
    box = _Box(LEFT, 40, width - LEFT - 120, height - 100)
    frame = _Frame(canvas, box, [-0.5, max(1, cols) - 0.5], [len(rows) - 0.5, -0.5], xlabel,
                   ylabel, x_ticks=False, y_ticks=False, grid=False)
    frame.index_ticks(cols, len(rows))
    for r, row in enumerate(rows):
        for c, value in enumerate(row):
            if _finite(value):
                frame.bar(c - 0.5, c + 0.5, r + 0.5, r - 0.5, _viridis(float(value), low, high),
                          outline=False)
    canvas.colour_scale(_Box(box.right + 25, box.top, 18, box.height), low, high, scale_label)
    return canvas.svg()


def write_svg(path: Path, svg: str) -> Path:
    """Write ``svg`` to ``path`` (a private file, like the rest of a run folder)."""
    touch_private(path).write_text(svg, encoding="utf-8")
    return path


@dataclass(frozen=True)
class _Box:
    """A rectangle in pixels: left, top, width, height."""

    left: float
    top: float
    width: float
    height: float

    @property
    def right(self) -> float:
        return self.left + self.width

    @property
    def bottom(self) -> float:
        return self.top + self.height


class _Canvas:
    """The SVG document being written: its size, title and elements."""

    def __init__(self, width: int, height: int, title: str) -> None:
        self.width, self.height = width, height
        self.parts = [f'<rect width="{width}" height="{height}" fill="white"/>']
        if title:
            self.text(width / 2, 22, title, size=15, anchor="middle", weight="bold")

    def text(self, x: float, y: float, text: str, *, size: int = 12, anchor: str = "start",
             rotate: float = 0, weight: str = "normal", cls: str = "") -> None:
        """A line of (escaped) text; ``rotate`` degrees about its anchor point."""
        turn = f' transform="rotate({rotate:g} {_n(x)} {_n(y)})"' if rotate else ""
        kind = f' class="{cls}"' if cls else ""
        bold = ' font-weight="bold"' if weight == "bold" else ""
        self.parts.append(f'<text{kind} x="{_n(x)}" y="{_n(y)}" font-size="{size}" '
                          f'text-anchor="{anchor}"{bold}{turn}>{escape(text)}</text>')

    def legend(self, entries: Sequence[tuple[str, str, str, bool]], left: float, top: float,
               across: bool = False) -> None:
        """Legend entries ``(label, colour, marker or "bar", dashed)``: one a row from
        ``top``, or in one row centred on the canvas with ``across``."""
        if not entries:
            return
        widths = [34 + _CHAR_W * 12 * len(label) + 16 for label, *_ in entries]
        x = (self.width - sum(widths)) / 2 if across else left
        y = top
        self.parts.append('<g class="legend">')
        for (label, color, marker, dashed), w in zip(entries, widths, strict=True):
            if marker == "bar":
                self.parts.append(f'<rect x="{_n(x)}" y="{_n(y - 9)}" width="24" height="10" '
                                  f'fill="{color}"/>')
            else:
                self.parts.append(_polyline([(x, y - 4), (x + 24, y - 4)], color, dashed,
                                           cls="key"))
                self.parts.append(_marker(x + 12, y - 4, marker, color))
            self.text(x + 30, y, label, size=12)
            if across:
                x += w
            else:
                y += 18
        self.parts.append("</g>")

    def colour_scale(self, box: _Box, low: float, high: float, label: str) -> None:
        """A vertical colour bar from ``low`` (bottom) to ``high`` (top), with ticks."""
        top_down = VIRIDIS[::-1]  # the gradient runs downwards, its offsets must rise
        stops = "".join(f'<stop offset="{_n(i * 100 / (len(top_down) - 1))}%" '
                        f'stop-color="{c}"/>' for i, c in enumerate(top_down))
        self.parts.append(f'<defs><linearGradient id="scale" x1="0" y1="0" x2="0" y2="1">'
                          f'{stops}</linearGradient></defs>')
        self.parts.append(f'<rect class="colour-scale" x="{_n(box.left)}" y="{_n(box.top)}" '
                          f'width="{_n(box.width)}" height="{_n(box.height)}" '
                          f'fill="url(#scale)" stroke="#555555"/>')
        ticks = [t for t in nice_ticks(low, high) if low - 1e-9 <= t <= high + 1e-9]
        for tick in ticks or [low]:
            share = 0.5 if high == low else (tick - low) / (high - low)
            y = box.bottom - share * box.height
            self.parts.append(f'<line x1="{_n(box.right)}" y1="{_n(y)}" x2="{_n(box.right + 4)}" '
                              f'y2="{_n(y)}" stroke="#555555"/>')
            self.text(box.right + 7, y + 4, tick_label(tick, ticks or [low]), size=11)
        self.text(box.right + 55, box.top + box.height / 2, label, size=12, anchor="middle",
                  rotate=-90)

    def svg(self) -> str:
        """The whole document."""
        return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" '
                f'height="{self.height}" viewBox="0 0 {self.width} {self.height}" {FONT}>\n'
                + "\n".join(self.parts) + "\n</svg>\n")


class _Frame:
    """One plot area: maps data to pixels (axes from the first tick to the last) and draws
    the frame, grid, ticks and labels."""

    def __init__(self, canvas: _Canvas, box: _Box, xticks: Sequence[float],
                 yticks: Sequence[float], xlabel: str, ylabel: str, *, title: str = "",
                 x_ticks: bool = True, y_ticks: bool = True, grid: bool = True) -> None:
        self.canvas, self.box = canvas, box
        self.x0, self.x1 = xticks[0], xticks[-1]
        self.y0, self.y1 = yticks[0], yticks[-1]
        canvas.parts.append(f'<rect class="plot-area" x="{_n(box.left)}" y="{_n(box.top)}" '
                            f'width="{_n(box.width)}" height="{_n(box.height)}" fill="none" '
                            f'stroke="#555555"/>')
        if x_ticks:
            for tick in xticks:
                self._x_tick(tick, tick_label(tick, xticks), grid)
        if y_ticks:
            for tick in yticks:
                self._y_tick(tick, tick_label(tick, yticks), grid)
        if title:
            canvas.text((box.left + box.right) / 2, box.top - 8, title, size=13,
                        anchor="middle")
        if xlabel:
            canvas.text((box.left + box.right) / 2, box.bottom + 40, xlabel, anchor="middle")
        if ylabel:
            canvas.text(box.left - LEFT + 20, (box.top + box.bottom) / 2, ylabel, anchor="middle",
                        rotate=-90)

    def x(self, value: float) -> float:
        """The pixel column of ``value`` on the x axis."""
        return self.box.left + (value - self.x0) / (self.x1 - self.x0) * self.box.width

    def y(self, value: float) -> float:
        """The pixel row of ``value`` on the y axis (upwards)."""
        return self.box.bottom - (value - self.y0) / (self.y1 - self.y0) * self.box.height

    def line(self, points: Sequence[tuple[float, float] | None], color: str, marker: str,
             dashed: bool) -> None:
        """A polyline per unbroken run of points, and a marker on each point."""
        for run in _runs(points):
            pixels = [(self.x(px), self.y(py)) for px, py in run]
            if len(pixels) > 1:
                self.canvas.parts.append(_polyline(pixels, color, dashed))
            self.canvas.parts.extend(_marker(px, py, marker, color) for px, py in pixels)

    def hline(self, value: float, color: str) -> None:
        """A dashed horizontal line across the plot area at ``value``."""
        y = self.y(value)
        self.canvas.parts.append(_polyline([(self.box.left, y), (self.box.right, y)], color,
                                           True, cls="reference"))

    def bar(self, x_from: float, x_to: float, y_from: float, y_to: float, color: str,
            outline: bool = True) -> None:
        """A filled rectangle between two data points (any corner order)."""
        left, right = sorted((self.x(x_from), self.x(x_to)))
        top, bottom = sorted((self.y(y_from), self.y(y_to)))
        edge = ' stroke="white" stroke-width="0.5"' if outline else ""
        self.canvas.parts.append(f'<rect class="bar" x="{_n(left)}" y="{_n(top)}" '
                                 f'width="{_n(right - left)}" height="{_n(bottom - top)}" '
                                 f'fill="{color}"{edge}/>')

    def categories(self, names: Sequence[str], rotate: bool) -> None:
        """Category names under the bars (turned 45 degrees when there are many)."""
        for i, name in enumerate(names):
            x, y = self.x(i), self.box.bottom + 16
            if rotate:
                self.canvas.text(x, y, name, size=11, anchor="end", rotate=-45, cls="tick")
            else:
                self.canvas.text(x, y, name, size=11, anchor="middle", cls="tick")

    def index_ticks(self, cols: int, rows: int) -> None:
        """Whole-number ticks at cell centres: columns below, rows on the left."""
        for col in _index_ticks(cols):
            self._x_tick(col, str(col), False)
        for row in _index_ticks(rows):
            self._y_tick(row, str(row), False)

    def _x_tick(self, value: float, label: str, grid: bool) -> None:
        x, bottom = self.x(value), self.box.bottom
        if grid:
            self.canvas.parts.append(f'<line x1="{_n(x)}" y1="{_n(self.box.top)}" x2="{_n(x)}" '
                                     f'y2="{_n(bottom)}" stroke="#e5e5e5"/>')
        self.canvas.parts.append(f'<line x1="{_n(x)}" y1="{_n(bottom)}" x2="{_n(x)}" '
                                 f'y2="{_n(bottom + 4)}" stroke="#555555"/>')
        self.canvas.text(x, bottom + 17, label, size=11, anchor="middle", cls="tick")

    def _y_tick(self, value: float, label: str, grid: bool) -> None:
        y, left = self.y(value), self.box.left
        if grid:
            self.canvas.parts.append(f'<line x1="{_n(left)}" y1="{_n(y)}" '
                                     f'x2="{_n(self.box.right)}" y2="{_n(y)}" stroke="#e5e5e5"/>')
        self.canvas.parts.append(f'<line x1="{_n(left - 4)}" y1="{_n(y)}" x2="{_n(left)}" '
                                 f'y2="{_n(y)}" stroke="#555555"/>')
        self.canvas.text(left - 7, y + 4, label, size=11, anchor="end", cls="tick")


def _index_ticks(count: int) -> list[int]:
    """Whole-number positions 0..count-1 to label, at most about ten."""
    if count <= 0:
        return []
    step = max(1.0, nice_ticks(0, count - 1, count=min(count, 10), integer=True)[1])
    return list(range(0, count, int(step)))


def _finite(value: object) -> TypeGuard[float]:
    """A number that is neither missing, NaN nor infinite (booleans are not numbers here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)


def _value(value: float | None) -> float:
    return float(value) if _finite(value) else 0.0


def _points(series: Series) -> list[tuple[float, float] | None]:
    """The series' points; None where a value is missing (the line breaks there)."""
    return [(float(x), float(y)) if _finite(x) and _finite(y) else None
            for x, y in zip(series.x, series.y, strict=False)]


def _runs(points: Sequence[tuple[float, float] | None]) -> list[list[tuple[float, float]]]:
    runs: list[list[tuple[float, float]]] = [[]]
    for point in points:
        if point is None:
            runs.append([])
        else:
            runs[-1].append(point)
    return [run for run in runs if run]


def _span(values: Sequence[float]) -> tuple[float, float]:
    """(lowest, highest) of ``values``; (0, 1) for none."""
    return (min(values), max(values)) if values else (0.0, 1.0)


def _legend_height(entries: int) -> int:
    return 18 * entries + 6 if entries else 0


def _viridis(value: float, low: float, high: float) -> str:
    """The colour of ``value`` on the scale from ``low`` to ``high``."""
    share = 0.5 if high <= low else min(1.0, max(0.0, (value - low) / (high - low)))
    where = share * (len(VIRIDIS) - 1)
    i = min(len(VIRIDIS) - 2, int(where))
    a, b = VIRIDIS[i], VIRIDIS[i + 1]
    mix = [round(int(a[k:k + 2], 16) * (1 - where + i) + int(b[k:k + 2], 16) * (where - i))
           for k in (1, 3, 5)]
    return "#" + "".join(f"{c:02x}" for c in mix)


def _polyline(points: Sequence[tuple[float, float]], color: str, dashed: bool,
              cls: str = "series") -> str:
    dash = ' stroke-dasharray="6 4"' if dashed else ""
    coords = " ".join(f"{_n(x)},{_n(y)}" for x, y in points)
    return (f'<polyline class="{cls}" points="{coords}" fill="none" stroke="{escape(color)}" '
            f'stroke-width="1.5"{dash}/>')


def _marker(x: float, y: float, marker: str, color: str) -> str:
    if marker == "square":
        return (f'<rect class="marker" x="{_n(x - 3)}" y="{_n(y - 3)}" width="6" height="6" '
                f'fill="{escape(color)}"/>')
    if marker == "circle":
        return f'<circle class="marker" cx="{_n(x)}" cy="{_n(y)}" r="3" fill="{escape(color)}"/>'
    return ""


def escape(text: str) -> str:
    """``text`` safe inside an SVG element or a double-quoted attribute (xml.sax.saxutils
    would do, but loads urllib and http with it)."""
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;"))


def _clean(value: float) -> float:
    """A tick value without float noise (0.30000000000000004 -> 0.3)."""
    return float(f"{value:.12g}") + 0.0


def _n(value: float) -> str:
    """A pixel coordinate, to two decimals."""
    return f"{value:.2f}".rstrip("0").rstrip(".")
