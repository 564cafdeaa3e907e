"""The workflows: listed with their progress, a workflow's graph drawn, cancelled.

A workflow's page draws its steps as an inline SVG laid out by the server
(no JavaScript): one column per layer, a step's layer the longest path to it
from a step that waits on nothing, boxes coloured by state, arrows for
``after``. A column of more than ``LAYER_CAP`` steps draws the first ones
and a "+N more" box, so a 1,000-step fan-out stays a readable page; the
table of steps under the graph lists ``STEPS_PER_PAGE`` steps a page.
Read-only; **Cancel selected workflows** is one service call per workflow,
a History entry and a message, guarded by ``change_workflow``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html

from ..conf import app_settings
from ..display import error_summary, format_timestamp
from ..models import DeadJob, Job, JobResult, Workflow, WorkflowState
from ..records import Workflow as WorkflowRecord
from ..records import WorkflowStep as StepRecord
from ..store import get_store
from ..validation import parse_id
from .base import WARNING_MARK, AlkstoreModelAdmin, JobIdSearchMixin
from .base import has_perm as _has_perm

# The layout, in SVG user units (CSS pixels at 100 %).
BOX_W = 176
BOX_H = 44
COL_GAP = 64
ROW_GAP = 10
MARGIN = 8
# Characters that fit a box's width: the step name in bold 12 px, the second line in 11 px.
NAME_CHARS = 22
LINE_CHARS = 27
# Steps drawn in one column; the rest of the column is one "+N more" box.
LAYER_CAP = 40
STEPS_PER_PAGE = 200
RESULT_CHARS = 120
# A fan-in's row names its first parents, not all 1,000.
AFTER_NAMES = 5
TITLE_CHARS = 1000
STEP_STATES = ("waiting", "pending", "processing", "succeeded", "failed", "cancelled")
_DIGITS = re.compile(r"(\d+)")
CANCELLED = "Cancelled: its unfinished steps cancelled, their pending jobs deleted."


@dataclass(frozen=True)
class Box:
    """One drawn step, or a column's "+N more" box (``more`` > 0, no step)."""

    key: str
    x: int
    y: int
    label: str
    line: str
    state: str
    title: str
    more: int = 0
    href: str = ""
    selected: bool = False

    @property
    def text_x(self) -> int:
        return self.x + 8

    @property
    def cx(self) -> int:
        return self.x + BOX_W // 2


@dataclass(frozen=True)
class Edge:
    """An arrow from a parent's right side to a dependant's left side (an SVG path)."""

    d: str


@dataclass(frozen=True)
class Graph:
    """A workflow's drawing: its size, boxes and arrows; ``hidden`` steps are in "+N more" boxes."""

    width: int
    height: int
    box_w: int
    box_h: int
    boxes: list[Box]
    edges: list[Edge]
    layers: int
    hidden: int


def cut(text: str, limit: int) -> str:
    """Return ``text`` cut to ``limit`` characters (… marks a cut)."""
    return text if len(text) <= limit else f"{text[: limit - 1]}…"


def layers_of(steps: Mapping[str, StepRecord]) -> dict[str, int]:
    """Return each step's layer: the longest path to it from a step that waits on nothing.

    The steps are walked parents first (Kahn's order), so each layer is one
    more than its deepest parent's; an ``after`` naming no step is ignored.
    """
    waiting = {name: sum(p in steps for p in s.after) for name, s in steps.items()}
    children: dict[str, list[str]] = {name: [] for name in steps}
    for name, step in steps.items():
        for parent in step.after:
            if parent in children:
                children[parent].append(name)
    layer = dict.fromkeys(steps, 0)
    ready = [name for name, count in waiting.items() if count == 0]
    while ready:
        name = ready.pop()
        for child in children[name]:
            layer[child] = max(layer[child], layer[name] + 1)
            waiting[child] -= 1
            if waiting[child] == 0:
                ready.append(child)
    return layer


def columns_of(steps: Mapping[str, StepRecord]) -> list[list[str]]:
    """Return the steps by layer, each layer ordered by its parents' mean position.

    One downward pass of the barycentre heuristic: a step sits near the
    steps it waits on, so a diamond's arrows do not cross. Ties go by name,
    numbers as numbers (``part-2`` before ``part-10``).
    """
    layer = layers_of(steps)
    order = {name: _natural(name) for name in steps}
    columns: list[list[str]] = [[] for _ in range(max(layer.values(), default=-1) + 1)]
    for name in steps:
        columns[layer[name]].append(name)
    position: dict[str, float] = {}
    for column in columns:

        def centre(name: str) -> tuple[float, tuple[Any, ...]]:
            parents = [position[p] for p in steps[name].after if p in position]
            return (sum(parents) / len(parents) if parents else -1.0, order[name])

        column.sort(key=centre)
        for i, name in enumerate(column):
            position[name] = i / max(len(column) - 1, 1)
    return columns


def drawn_of(column: list[str], cap: int = LAYER_CAP) -> list[str]:
    """Return the steps of ``column`` drawn as boxes: all, or the first ``cap`` and a "+N more"."""
    # A "+1 more" box would hide a step in the room it takes.
    return column if len(column) <= cap + 1 else column[:cap]


def layout(
    steps: Mapping[str, StepRecord],
    href: Mapping[str, str] | None = None,
    *,
    selected: str | None = None,
    columns: list[list[str]] | None = None,
    cap: int = LAYER_CAP,
) -> Graph:
    """Lay out ``steps`` as boxes in columns and arrows for ``after``; ``href`` links a box.

    ``selected`` names a step to outline (the one a job's page linked to).

    A column holds at most ``cap`` boxes: the rest of its steps are one
    "+N more" box, their arrows drawn once to and from it.
    """
    href = href or {}
    columns = columns_of(steps)
    rows = max((min(len(c), cap + 1) for c in columns), default=0)
    full_h = rows * (BOX_H + ROW_GAP) - ROW_GAP
    boxes: list[Box] = []
    # Where each step is drawn: its own box, or its column's "+N more" box.
    drawn_as: dict[str, Box] = {}
    hidden = 0
    for i, column in enumerate(columns):
        shown = drawn_of(column, cap)
        count = len(shown) + (len(shown) < len(column))
        top = MARGIN + (full_h - (count * (BOX_H + ROW_GAP) - ROW_GAP)) // 2
        x = MARGIN + i * (BOX_W + COL_GAP)
        for j, name in enumerate(shown):
            step = steps[name]
            box = Box(
                key=name,
                x=x,
                y=top + j * (BOX_H + ROW_GAP),
                label=cut(name, NAME_CHARS),
                line=cut(f"{step.queue} · {step.state}", LINE_CHARS),
                state=step.state,
                title=_box_title(step),
                href=href.get(name, ""),
                selected=name == selected,
            )
            boxes.append(box)
            drawn_as[name] = box
        rest = column[len(shown) :]
        if rest:
            hidden += len(rest)
            more = Box(
                key="",
                x=x,
                y=top + len(shown) * (BOX_H + ROW_GAP),
                label=f"+{len(rest)} more",
                line=_state_counts(steps[name].state for name in rest),
                state="more",
                title=f"{len(rest)} more steps in this layer: see the table below",
                more=len(rest),
            )
            boxes.append(more)
            drawn_as.update(dict.fromkeys(rest, more))
    edges: list[Edge] = []
    seen: set[tuple[int, int]] = set()
    for name, step in steps.items():
        child = drawn_as[name]
        for parent_name in step.after:
            parent = drawn_as.get(parent_name)
            if parent is None or (id(parent), id(child)) in seen:
                continue
            seen.add((id(parent), id(child)))
            edges.append(_arrow(parent, child))
    width = MARGIN * 2 + len(columns) * (BOX_W + COL_GAP) - COL_GAP
    return Graph(
        width=max(width, BOX_W + 2 * MARGIN),
        height=max(full_h, BOX_H) + 2 * MARGIN,
        box_w=BOX_W,
        box_h=BOX_H,
        boxes=boxes,
        edges=edges,
        layers=len(columns),
        hidden=hidden,
    )


def _natural(name: str) -> tuple[Any, ...]:
    # The split alternates text and digits, text first: like parts compare with like.
    return tuple(int(part) if i % 2 else part for i, part in enumerate(_DIGITS.split(name)))


def _arrow(parent: Box, child: Box) -> Edge:
    x1, y1 = parent.x + BOX_W, parent.y + BOX_H // 2
    x2, y2 = child.x - 2, child.y + BOX_H // 2  # the arrowhead ends at the box's edge
    bend = COL_GAP // 2
    return Edge(f"M{x1} {y1} C{x1 + bend} {y1} {x2 - bend} {y2} {x2} {y2}")


def _box_title(step: StepRecord) -> str:
    parts = [step.name, f"queue {step.queue}", step.state]
    if step.job_id is not None:
        parts.append(f"job {step.job_id}")
    if step.error:
        parts.append(cut(error_summary(step.error, TITLE_CHARS), TITLE_CHARS))
    return " · ".join(parts)


def _state_counts(states: Iterable[str]) -> str:
    counts: dict[str, int] = {}
    for state in states:
        counts[state] = counts.get(state, 0) + 1
    return cut(", ".join(f"{counts[s]} {s}" for s in STEP_STATES if s in counts), LINE_CHARS)


def _json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


@dataclass(frozen=True)
class StepRow:
    """One row of the steps table under the graph."""

    step: StepRecord
    after: str
    job: str
    job_href: str
    result: str
    result_title: str
    error: str
    finished_at: str
    selected: bool


class JobLinks:
    """Where a step's job is: live, a dead letter, or only its kept result; one query each."""

    def __init__(self, request: HttpRequest, job_ids: Iterable[int]) -> None:
        ids = sorted(set(job_ids))
        using = app_settings.database
        self.pages: list[tuple[set[int], str, str]] = []
        for model, kind, id_field in (
            (Job, "live job", "id"),
            (DeadJob, "dead letter", "id"),
            (JobResult, "result", "job_id"),
        ):
            found: set[int] = set()
            if ids and _has_perm(request, model._meta, "view"):
                rows = model.objects.using(using).filter(**{f"{id_field}__in": ids})  # type: ignore[attr-defined]
                found = set(rows.values_list(id_field, flat=True))
            name = f"admin:{model._meta.app_label}_{model._meta.model_name}_change"
            self.pages.append((found, kind, name))

    def of(self, step: StepRecord) -> tuple[str, str]:
        """Return (text, address) for the step's job; an empty address when there is no page."""
        if step.job_id is None:
            return "-", ""
        for found, kind, name in self.pages:
            if step.job_id in found:
                return f"{kind} {step.job_id}", reverse(name, args=[step.job_id])
        # An acked job's row is deleted; a result not kept (or expired) leaves nothing.
        gone = "acked" if step.state == "succeeded" else "gone"
        return f"job {step.job_id} ({gone})", ""


@admin.register(Workflow)
class WorkflowAdmin(JobIdSearchMixin, AlkstoreModelAdmin):
    list_display = ("id", "name", "state_mark", "steps_done", "started", "finished_at")
    list_filter = ("state",)
    search_fields = ("name",)
    ordering = ("-id",)
    list_per_page = 50
    show_full_result_count = False
    actions = ["cancel"]
    fields = ("id", "name", "state_mark", "steps_done", "started", "finished_at")
    readonly_fields = fields

    @admin.display(description="state", ordering="state")
    def state_mark(self, obj: Workflow) -> str:
        if obj.state in (WorkflowState.FAILED, WorkflowState.CANCELLED):
            return format_html(WARNING_MARK, f"alk-workflow-{obj.state}", obj.state)
        return format_html('<span class="alk-workflow-{}">{}</span>', obj.state, obj.state)

    @admin.display(description="steps done")
    def steps_done(self, obj: Workflow) -> str:
        return f"{obj.steps_total - obj.steps_open} of {obj.steps_total}"

    @admin.display(description="started", ordering="created_at")
    def started(self, obj: Workflow) -> str:
        return format_timestamp(obj.created_at)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Finished workflows leave through the upkeep's retention (WORKFLOW_RETENTION_S).
        return False

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return _has_perm(request, self.opts, "change")

    @admin.action(description="Cancel selected workflows", permissions=["cancel"])
    def cancel(self, request: HttpRequest, queryset: QuerySet) -> None:
        selected = list(queryset.only("id", "name", "state"))
        workflows = get_store(queryset.db)
        cancelled = [w for w in selected if workflows.cancel_workflow(w.pk)]
        self.log_action(request, cancelled, CANCELLED)
        ended = len(selected) - len(cancelled)
        note = f" {ended} had already ended: nothing to cancel." if ended else ""
        self.message_user(request, f"Cancelled {len(cancelled)} workflow(s).{note}")

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        extra = dict(extra_context or {})
        workflow_id = parse_id(object_id)
        record = None
        if workflow_id is not None and self.has_view_or_change_permission(request):
            record = get_store(app_settings.database).get_workflow(workflow_id)
        if record is not None:
            extra.update(self._graph_context(request, record))
        return super().change_view(request, object_id, form_url, extra)

    def _graph_context(self, request: HttpRequest, record: WorkflowRecord) -> dict[str, Any]:
        """The graph, its legend and one page of the steps table, for the change form."""
        columns = columns_of(record.steps)
        # The table lists the steps as the graph draws them: layer by layer.
        names = [name for column in columns for name in column]
        chosen = request.GET.get("step")
        pages = Paginator(names, STEPS_PER_PAGE)
        page_number: Any = request.GET.get("p", 1)
        if chosen in record.steps:
            page_number = names.index(chosen) // STEPS_PER_PAGE + 1
        page = pages.get_page(page_number)
        drawn = [name for column in columns for name in drawn_of(column)]
        links = JobLinks(
            request,
            (
                step.job_id
                for name in (*drawn, *page.object_list)
                if (step := record.steps[name]).job_id is not None
            ),
        )
        href: dict[str, str] = {}
        for name in drawn:
            address = links.of(record.steps[name])[1]
            # A step without a job page leads to its row in the table.
            href[name] = address or f"?{_query(step=name)}#alk-selected-step"
        rows = [self._row(record.steps[name], links, name == chosen) for name in page.object_list]
        counts = {state: 0 for state in STEP_STATES}
        for step in record.steps.values():
            counts[step.state] = counts.get(step.state, 0) + 1
        return {
            "workflow": record,
            "graph": layout(record.steps, href, selected=chosen, columns=columns),
            "legend": list(counts.items()),
            "step_rows": rows,
            "steps_page": page,
            "steps_pages": [
                (n, _query(p=n) if isinstance(n, int) else "")
                for n in pages.get_elided_page_range(page.number)
            ]
            if pages.num_pages > 1
            else [],
            "layer_cap": LAYER_CAP,
            "steps_per_page": STEPS_PER_PAGE,
        }

    def _row(self, step: StepRecord, links: JobLinks, selected: bool) -> StepRow:
        job, job_href = links.of(step)
        result = "" if step.result is None else _json_text(step.result)
        shown = ", ".join(step.after[:AFTER_NAMES])
        if len(step.after) > AFTER_NAMES:
            shown += f" and {len(step.after) - AFTER_NAMES} more"
        return StepRow(
            step=step,
            after=shown or "-",
            job=job,
            job_href=job_href,
            result=cut(result, RESULT_CHARS),
            result_title=cut(result, TITLE_CHARS) if len(result) > RESULT_CHARS else "",
            error=error_summary(step.error),
            finished_at=format_timestamp(step.finished_at),
            selected=selected,
        )


def _query(**params: Any) -> str:
    return urlencode(params)
