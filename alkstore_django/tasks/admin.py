"""The admin for Django Tasks results, next to the live jobs and dead letters.

Registered when ``admin/__init__`` imports it; it needs only the model, so it works on Django
5.2 too (where the table is simply empty).
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.utils.html import format_html_join
from django.utils.safestring import mark_safe

from ..admin.base import AlkstoreModelAdmin, JobIdSearchMixin, job_link, pre
from ..models import TaskResult


@admin.register(TaskResult)
class TaskResultAdmin(JobIdSearchMixin, AlkstoreModelAdmin):
    """Read-only: results are written by the worker in the outcome's transaction."""

    # Fits a 1400 px window beside the filters: the backend is a filter (most
    # sites have one) and the task path may wrap at its dots.
    list_display = ("id", "task", "status", "queue", "enqueued_at", "finished_at")
    list_filter = ("status", "backend", "queue")
    search_fields = ("task_path",)
    ordering = ("-id",)
    list_per_page = 50
    show_full_result_count = False
    readonly_fields = (
        "id",
        "job",
        "task_path",
        "status",
        "backend",
        "queue",
        "priority",
        "run_after",
        "args_pretty",
        "kwargs_pretty",
        "return_value_pretty",
        "errors_pretty",
        "worker_ids",
        "enqueued_at",
        "started_at",
        "last_attempted_at",
        "finished_at",
    )
    fields = readonly_fields

    @admin.display(description="task", ordering="task_path")
    def task(self, obj: TaskResult) -> str:
        """The import path with a line-break opportunity after each dot."""
        parts = [f"{part}." for part in obj.task_path.split(".")]
        parts[-1] = parts[-1][:-1]
        return format_html_join(mark_safe("<wbr>"), "{}", ((part,) for part in parts))

    @admin.display(description="job")
    def job(self, obj: TaskResult) -> str:
        """Link to the job while it is live or dead-lettered (same id)."""
        return job_link(obj.id, "gone (acked, or dead letter purged)", live="live")

    @admin.display(description="args")
    def args_pretty(self, obj: TaskResult) -> str:
        return _pre(obj.args)

    @admin.display(description="kwargs")
    def kwargs_pretty(self, obj: TaskResult) -> str:
        return _pre(obj.kwargs)

    @admin.display(description="return value")
    def return_value_pretty(self, obj: TaskResult) -> str:
        return _pre(obj.return_value)

    @admin.display(description="errors (one per failed attempt)")
    def errors_pretty(self, obj: TaskResult) -> str:
        text = "\n".join(
            f"{_attempt_label(e.get('attempt'))}: {e.get('exception_class_path')}\n"
            f"{e.get('traceback', '')}"
            for e in obj.errors or []
        )
        return pre(text)


def _attempt_label(attempt: Any) -> str:
    """Name an error's attempt; 0 and below are a requeued dead letter's earlier run."""
    if isinstance(attempt, int) and attempt <= 0:
        return "before the requeue"
    return f"attempt {attempt if attempt is not None else '?'}"


def _pre(value: Any) -> str:
    return pre(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False))
