"""Tokens-over-turns charts as plain numbers for an inline SVG the template draws.

Server-rendered on purpose: the comparison is a finished result, so the page
needs no script to show it, and one scale for every policy makes the curves
comparable at a glance.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Series:
    name: str
    label: str
    points: str  # "x,y x,y …" for <polyline points>
    end_x: float
    end_y: float
    peak: int


@dataclass(frozen=True)
class Tick:
    at: float
    label: str


@dataclass
class Chart:
    width: int
    height: int
    left: int
    top: int
    right: int
    bottom: int
    window_y: float
    threshold_y: float
    window: int
    threshold: int
    series: list[Series] = field(default_factory=list)
    y_ticks: list[Tick] = field(default_factory=list)
    x_ticks: list[Tick] = field(default_factory=list)


def _short(value: float) -> str:
    if value >= 1_000_000:
        return f"{value / 1_000_000:.1f}M"
    if value >= 1_000:
        return f"{value / 1_000:.0f}k" if value >= 10_000 else f"{value / 1_000:.1f}k"
    return f"{value:.0f}"


def _nice_step(span: float, count: int) -> float:
    raw = span / max(count, 1)
    magnitude = 10 ** len(str(int(raw))) / 10 if raw >= 1 else 1
    for factor in (1, 2, 2.5, 5, 10):
        if raw <= factor * magnitude:
            return factor * magnitude
    return 10 * magnitude


def token_chart(lines: Sequence[tuple[str, str, Sequence[int]]], *, window: int, threshold: int,
                width: int = 760, height: int = 240, compact: bool = False) -> Chart:
    """One chart for (name, label, tokens per turn) series sharing the window and threshold lines."""
    left, right = (44, width - 8) if compact else (56, width - 16)
    top, bottom = (8, height - 18) if compact else (12, height - 28)
    peak = max((max(v, default=0) for _, _, v in lines), default=0)
    top_value = max(window, peak, 1) * 1.08
    turns = max((len(v) for _, _, v in lines), default=0)

    def x(index: int) -> float:
        return left + (right - left) * (index / (turns - 1) if turns > 1 else 0.5)

    def y(value: float) -> float:
        return bottom - (bottom - top) * (value / top_value)

    chart = Chart(width=width, height=height, left=left, top=top, right=right, bottom=bottom,
                  window_y=round(y(window), 1), threshold_y=round(y(threshold), 1), window=window, threshold=threshold)
    for name, label, values in lines:
        points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(values))
        end = len(values) - 1
        chart.series.append(Series(name=name, label=label, points=points,
                                   end_x=round(x(end), 1) if values else left,
                                   end_y=round(y(values[-1]), 1) if values else bottom,
                                   peak=max(values, default=0)))
    step = _nice_step(top_value, 3 if compact else 5)
    value = 0.0
    while value <= top_value:
        chart.y_ticks.append(Tick(round(y(value), 1), _short(value)))
        value += step
    if turns:
        every = max(1, round(turns / (4 if compact else 8)))
        marks = list(range(0, turns, every))
        if marks[-1] != turns - 1:
            # The last turn is always labelled; a regular tick too close to it gives way.
            if turns - 1 - marks[-1] < every * 0.6 and len(marks) > 1:
                marks.pop()
            marks.append(turns - 1)
        chart.x_ticks = [Tick(round(x(i), 1), str(i + 1)) for i in marks]
    return chart
