"""Presentation helpers shared by the admin and ``manage.py alkstore``: ages and the chart."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .outcomes import OutcomeBucket

CHART_WIDTH = 720
CHART_HEIGHT = 180
CHART_LEFT = 40
CHART_BOTTOM = 20
CHART_TOP = 10


def format_age(seconds: float | None) -> str:
    """Return ``seconds`` as a short age: ``45s``, ``3m 12s``, ``2h 05m``, ``3d 4h``; - for None."""
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86_400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86_400}d {s % 86_400 // 3600}h"


@dataclass(frozen=True)
class Bar:
    """One rectangle of the chart, in SVG user units."""

    x: float
    y: float
    width: float
    height: float
    kind: str
    label: str


@dataclass(frozen=True)
class Chart:
    """A stacked bar chart: finished (acked) below, dead-lettered above, one bar a minute."""

    width: int
    height: int
    bars: list[Bar]
    peak: int
    ticks: list[tuple[float, str, str]]
    baseline_y: float
    left: int
    total_acked: int
    total_dead: int


def outcome_chart(buckets: Sequence[OutcomeBucket]) -> Chart:
    """Lay out ``buckets`` (oldest first) as bars; the scale is the busiest minute."""
    plot_w = CHART_WIDTH - CHART_LEFT - 4
    plot_h = CHART_HEIGHT - CHART_BOTTOM - CHART_TOP
    baseline = CHART_TOP + plot_h
    peak = max((b.acked + b.dead for b in buckets), default=0)
    scale = plot_h / peak if peak else 0.0
    step = plot_w / max(len(buckets), 1)
    bar_w = max(step - 2, 1)
    bars: list[Bar] = []
    ticks: list[tuple[float, str, str]] = []
    for i, bucket in enumerate(buckets):
        x = CHART_LEFT + i * step + 1
        label = f"{bucket.minute:%H:%M} UTC: {bucket.acked} finished, {bucket.dead} dead-lettered"
        acked_h = bucket.acked * scale
        dead_h = bucket.dead * scale
        if bucket.acked:
            bars.append(Bar(x, baseline - acked_h, bar_w, acked_h, "acked", label))
        if bucket.dead:
            bars.append(Bar(x, baseline - acked_h - dead_h, bar_w, dead_h, "dead", label))
        if i == len(buckets) - 1:
            # The newest label ends at its bar so it is not clipped at the edge.
            ticks.append((x + bar_w, f"{bucket.minute:%H:%M}", "end"))
        elif i % 10 == 0 and i < len(buckets) - 5:
            ticks.append((x + bar_w / 2, f"{bucket.minute:%H:%M}", "middle"))
    return Chart(
        width=CHART_WIDTH,
        height=CHART_HEIGHT,
        bars=bars,
        peak=peak,
        ticks=ticks,
        baseline_y=baseline,
        left=CHART_LEFT,
        total_acked=sum(b.acked for b in buckets),
        total_dead=sum(b.dead for b in buckets),
    )
