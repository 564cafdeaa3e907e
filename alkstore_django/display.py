"""Presentation helpers shared by the admin and ``manage.py alkstore``: ages, times, the chart."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.utils.timezone import is_aware, localtime

from .records import Settled

if TYPE_CHECKING:
    from .records import Workflow, WorkflowStep
    from .throughput import ThroughputMinute

ERROR_PREVIEW_CHARS = 80
RESULT_PREVIEW_CHARS = 60
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


def error_summary(error: str | None, limit: int = ERROR_PREVIEW_CHARS) -> str:
    """Return an error's last non-blank line, cut to ``limit`` characters (… marks a cut).

    A traceback's last line names the exception: the most telling part for a list row.
    """
    lines = [line.strip() for line in (error or "").splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    return last if len(last) <= limit else f"{last[: limit - 1]}…"


def format_timestamp(value: datetime | None) -> str:
    """Return ``value`` to the second in the current time zone, ``2025-03-01 14:05:09``; - for None.

    Operators compare claim deadlines and deaths that are seconds apart;
    Django's default ``DATETIME_FORMAT`` stops at the minute.
    """
    if value is None:
        return "-"
    return f"{localtime(value) if is_aware(value) else value:%Y-%m-%d %H:%M:%S}"


@dataclass(frozen=True)
class Bar:
    """One rectangle of the chart, in SVG user units; ``kind`` is its series (and CSS class)."""

    x: float
    y: float
    width: float
    height: float
    kind: Settled
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


def throughput_chart(buckets: Sequence[ThroughputMinute]) -> Chart:
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
            bars.append(Bar(x, baseline - acked_h, bar_w, acked_h, Settled.ACKED, label))
        if bucket.dead:
            bars.append(Bar(x, baseline - acked_h - dead_h, bar_w, dead_h, Settled.DEAD, label))
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


# --- workflows on the command line -------------------------------------------------

WORKFLOW_COLUMNS = ("id", "name", "state", "steps done", "created", "finished")
STEP_COLUMNS = ("step", "queue", "state", "after", "job", "error", "result")


def compact_json(value: Any, limit: int = RESULT_PREVIEW_CHARS) -> str:
    """Return ``value`` as one line of JSON, cut to ``limit`` characters (… marks a cut).

    None (a step without a result) is ``-``.
    """
    if value is None:
        return "-"
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    return text if len(text) <= limit else f"{text[: limit - 1]}…"


def workflow_row(workflow: Workflow) -> tuple[str, ...]:
    """Return ``workflow``'s row under ``WORKFLOW_COLUMNS``."""
    return (
        str(workflow.id),
        workflow.name or "-",
        workflow.state,
        f"{workflow.steps_done}/{workflow.steps_total}",
        format_timestamp(workflow.created_at),
        format_timestamp(workflow.finished_at),
    )


def step_row(step: WorkflowStep) -> tuple[str, ...]:
    """Return ``step``'s row under ``STEP_COLUMNS``: its error's last line, its result cut short."""
    return (
        step.name,
        step.queue,
        step.state,
        ", ".join(step.after) or "-",
        "-" if step.job_id is None else str(step.job_id),
        error_summary(step.error) or "-",
        compact_json(step.result),
    )


def workflow_data(workflow: Workflow, *, with_steps: bool = True) -> dict[str, Any]:
    """Return ``workflow`` as JSON-ready data: its fields, ``steps_done``, its steps in order.

    The steps are a list (each with its ``name``) in the order they were
    written, parents before their dependants; without ``with_steps`` (a
    listing, whose records have none) the key is left out.
    """
    data = asdict(workflow)
    data["steps_done"] = workflow.steps_done
    data["steps"] = [asdict(step) for step in workflow.steps.values()]
    if not with_steps:
        del data["steps"]
    return data
