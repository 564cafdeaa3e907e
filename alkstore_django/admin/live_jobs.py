"""The live jobs: pending and processing rows, overdue claims marked, retried or cancelled.

Read-only; the actions (retry now, cancel) are one service call each, a
History entry and a message, each guarded by its permission.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.contrib.admin.models import CHANGE, DELETION
from django.db.models import BooleanField, Case, Q, QuerySet, Value, When
from django.db.models.functions import Now
from django.http import HttpRequest
from django.utils.html import format_html

from .. import operations
from ..display import format_timestamp
from ..models import Job, JobState
from ..records import Progress
from .base import (
    WARNING_MARK,
    JobIdSearchMixin,
    TagFilter,
    TagsMixin,
    workflow_step_link,
)
from .base import has_perm as _has_perm
from .base import pre as _pre
from .cancel_button import CancelButtonAdmin


class OverdueFilter(admin.SimpleListFilter):
    """Processing jobs whose claim deadline has passed (a dead or stuck worker)."""

    title = "claim"
    parameter_name = "overdue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "overdue")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() == "yes":
            return queryset.filter(is_overdue=True)
        return queryset


def progress_html(stored: Any, at: Any) -> str:
    """Return a job's last reported progress as a bar with done/total and the note, or "-".

    An unknown total draws the browser's indeterminate bar; the note is the
    handler's text, escaped like every other value on the page.
    """
    progress = Progress.from_stored(stored, at)
    if progress is None:
        return "-"
    done, total = progress.done, progress.total
    title = f"reported {format_timestamp(at)}" if at is not None else "reported"
    if total is None:
        bar = format_html('<progress title="{}"></progress> {} done', title, done)
    else:
        percent = 100 if total <= 0 else min(100, 100 * done // total)
        bar = format_html(
            '<progress value="{}" max="100" title="{}">{}%</progress> {}/{} ({}%)',
            percent,
            title,
            percent,
            done,
            total,
            percent,
        )
    if progress.note:
        return format_html('{} <span class="alk-progress-note">{}</span>', bar, progress.note)
    return bar


@admin.register(Job)
class JobAdmin(TagsMixin, JobIdSearchMixin, CancelButtonAdmin):
    list_display = (
        "id",
        "queue",
        "state",
        "attempts_of_max",
        "run_at",
        "claimed_by",
        "claim_deadline",
        "progress_bar",
        "tag_list",
    )
    list_filter = ("queue", "state", OverdueFilter, TagFilter)
    search_fields = ("worker_id", "last_error")
    search_help_text = "Worker id or error text, a job id, or tag:TAG (a lone tag matches too)."
    ordering = ("-id",)
    list_per_page = 50
    show_full_result_count = False
    actions = ["retry_now", "cancel", "cancel_running"]
    readonly_fields = (
        "id",
        "queue",
        "workflow_step",
        "state",
        "progress_bar",
        "attempts",
        "max_attempts",
        "priority",
        "enqueued_at",
        "run_at",
        "worker_id",
        "claim_expires_at",
        "cancel_requested_at",
        "expires_at",
        "visibility_timeout_s",
        "timeout_s",
        "retry_base_s",
        "last_error",
        "unique_key",
        "tag_list",
        "result_kept",
        "payload_pretty",
    )
    fields = readonly_fields

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        # Overdue by the database clock, in the same query as the page.
        overdue = Case(
            When(Q(state=JobState.PROCESSING, claim_expires_at__lte=Now()), then=Value(True)),
            default=Value(False),
            output_field=BooleanField(),
        )
        return super().get_queryset(request).annotate(is_overdue=overdue)

    @admin.display(description="attempts")
    def attempts_of_max(self, obj: Job) -> str:
        return f"{obj.attempts}/{obj.max_attempts}"

    @admin.display(description="claimed by", ordering="worker_id")
    def claimed_by(self, obj: Job) -> str:
        return obj.worker_id or "-"

    @admin.display(description="claim deadline", ordering="claim_expires_at")
    def claim_deadline(self, obj: Job) -> str:
        if obj.claim_expires_at is None:
            return "-"
        when = format_timestamp(obj.claim_expires_at)
        if getattr(obj, "is_overdue", False):
            return format_html("{} " + WARNING_MARK, when, "alk-overdue", "overdue")
        return when

    @admin.display(description="progress")
    def progress_bar(self, obj: Job) -> str:
        return progress_html(obj.progress, obj.progress_at)

    @admin.display(description="workflow")
    def workflow_step(self, obj: Job) -> str:
        return workflow_step_link(obj.workflow_id, obj.step)

    @admin.display(description="result")
    def result_kept(self, obj: Job) -> str:
        """A live job has no result yet: whether one will be kept, and for how long."""
        if obj.keep_result_s is None:
            return "not kept (enqueued without keep_result_s)"
        return f"keeps its result for {obj.keep_result_s:g} s once it has finished"

    @admin.display(description="payload")
    def payload_pretty(self, obj: Job) -> str:
        return _pre(json.dumps(obj.payload, indent=2, ensure_ascii=False, sort_keys=True))

    def has_retry_now_permission(self, request: HttpRequest) -> bool:
        return _has_perm(request, self.opts, "change")

    @admin.action(description="Retry selected jobs now", permissions=["retry_now"])
    def retry_now(self, request: HttpRequest, queryset: QuerySet) -> None:
        selected = list(queryset.only("id", "queue", "state"))
        idle = set(operations.not_waiting([j.pk for j in selected], using=queryset.db))
        waiting = [j for j in selected if j.pk not in idle]
        retried = operations.retry_now([j.pk for j in waiting], using=queryset.db)
        self.log_action(request, waiting, "Made due now.", flag=CHANGE)
        note = ""
        if idle:
            note = f" {len(idle)} were not waiting for a retry (running, due, or never attempted)."
        self.message_user(request, f"Made {retried} job(s) due now.{note}")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return _has_perm(request, self.opts, "delete")

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Live jobs leave only through "cancel" (one statement, any number of rows).
        return False

    @admin.action(description="Cancel selected jobs", permissions=["cancel"])
    def cancel(self, request: HttpRequest, queryset: QuerySet) -> None:
        selected = list(queryset.only("id", "queue", "state"))
        cancelled = operations.cancel_jobs([j.pk for j in selected], using=queryset.db)
        self.log_action(request, selected, "Cancelled.", flag=DELETION)
        self.message_user(request, f"Cancelled {cancelled} job(s).")
