"""The operators' admin: dead letters, live jobs, schedules, locks and the queue overview.

Read-only by default. Every action is one service call (``operations``) and a
message; each is guarded by its own permission, so an action a user may not
run is neither offered nor accepted from a forged POST.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.contrib.admin import DateFieldListFilter
from django.contrib.auth import get_permission_codename
from django.core.exceptions import PermissionDenied
from django.db.models import BooleanField, Case, Q, QuerySet, Value, When
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django.utils.formats import date_format
from django.utils.html import format_html
from django.utils.text import Truncator
from django.utils.timezone import localtime

from . import operations
from .conf import app_settings
from .display import format_age, outcome_chart
from .models import DeadJob, Job, JobState, Lock, Schedule
from .outcomes import recent_outcomes

ERROR_PREVIEW_CHARS = 80
CHART_MINUTES = 60
MARK = '<strong class="{}" style="color: #ba2121">{}</strong>'


def _has_perm(request: HttpRequest, opts: Any, action: str) -> bool:
    return request.user.has_perm(f"{opts.app_label}.{get_permission_codename(action, opts)}")


def _pre(value: str) -> str:
    return format_html('<pre style="white-space: pre-wrap; margin: 0">{}</pre>', value)


class AlkstoreModelAdmin(admin.ModelAdmin):
    """Rows live in ``ALKSTORE["DATABASE"]``; forms are read-only."""

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).using(app_settings.database)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class JobIdSearchMixin:
    """Search matches a job id exactly when the term is a number, besides the text fields."""

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet, search_term: str
    ) -> tuple[QuerySet, bool]:
        found, may_have_duplicates = super().get_search_results(  # type: ignore[misc]
            request, queryset, search_term
        )
        term = search_term.strip()
        if term.isdigit() and int(term) < 2**63:
            # Both sides start from the filtered queryset, so list filters still apply.
            found |= queryset.filter(id=int(term))
        return found, may_have_duplicates


class DeadQueueFilter(admin.SimpleListFilter):
    """Filter by queue; the choices come from an index probe per queue, not a full scan."""

    title = "queue"
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = operations.dead_letter_queues(using=app_settings.database)
        chosen = self.value()
        # Keep the chosen queue listed after its last dead letter is requeued.
        if chosen is not None and chosen not in names:
            names = sorted([*names, chosen])
        return [(q, q) for q in names]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() is not None:
            return queryset.filter(queue=self.value())
        return queryset


@admin.register(DeadJob)
class DeadJobAdmin(JobIdSearchMixin, AlkstoreModelAdmin):
    list_display = ("id", "queue", "attempts", "error_preview", "died_at")
    list_filter = (DeadQueueFilter, ("died_at", DateFieldListFilter))
    search_fields = ("last_error",)
    ordering = ("-died_at",)
    list_per_page = 50
    # The unfiltered total is a second count(*) per request; the filtered one is enough.
    show_full_result_count = False
    # "delete_selected" replaces Django's per-object delete with one statement.
    actions = ["requeue", "delete_selected"]
    fields = (
        "id",
        "queue",
        "died_at",
        "attempts",
        "error_full",
        "payload_pretty",
        "max_attempts",
        "priority",
        "enqueued_at",
        "run_at",
        "worker_id",
        "expires_at",
    )
    readonly_fields = fields

    @admin.display(description="error")
    def error_preview(self, obj: DeadJob) -> str:
        # A traceback's last line names the exception: the most telling part.
        lines = [line for line in (obj.last_error or "").splitlines() if line.strip()]
        return Truncator(lines[-1].strip() if lines else "").chars(ERROR_PREVIEW_CHARS)

    @admin.display(description="error")
    def error_full(self, obj: DeadJob) -> str:
        return _pre(obj.last_error or "")

    @admin.display(description="payload")
    def payload_pretty(self, obj: DeadJob) -> str:
        return _pre(json.dumps(obj.payload, indent=2, ensure_ascii=False, sort_keys=True))

    def has_requeue_permission(self, request: HttpRequest) -> bool:
        return _has_perm(request, self.opts, "requeue")

    @admin.action(description="Requeue selected dead letters", permissions=["requeue"])
    def requeue(self, request: HttpRequest, queryset: QuerySet) -> None:
        ids = list(queryset.values_list("pk", flat=True))
        moved = operations.requeue_dead(ids, using=queryset.db)
        self.message_user(request, f"Requeued {moved} dead letter(s): pending, due now.")

    @admin.action(description="Delete selected dead letters", permissions=["delete"])
    def delete_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        ids = list(queryset.values_list("pk", flat=True))
        deleted = operations.delete_dead(ids, using=queryset.db)
        self.message_user(request, f"Deleted {deleted} dead letter(s).")

    def get_urls(self) -> list[URLPattern]:
        overview = self.admin_site.admin_view(self.overview_view)
        return [path("overview/", overview, name="alkstore_django_overview"), *super().get_urls()]

    def overview_view(self, request: HttpRequest) -> HttpResponse:
        """The queue overview: per-queue counts and jobs finished per minute for an hour."""
        if not (self.has_view_permission(request) or _has_perm(request, Job._meta, "view")):
            raise PermissionDenied
        using = app_settings.database
        stats = operations.queue_overview(using=using)
        rows = [(s, format_age(s.oldest_pending_age_s)) for s in stats]
        context = {
            **self.admin_site.each_context(request),
            "title": "Queue overview",
            "opts": self.opts,
            "app_label": self.opts.app_label,
            "rows": rows,
            "chart": outcome_chart(recent_outcomes(using, CHART_MINUTES)),
            "chart_minutes": CHART_MINUTES,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/alkstore_django/overview.html", context)


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


@admin.register(Job)
class JobAdmin(JobIdSearchMixin, AlkstoreModelAdmin):
    list_display = (
        "id",
        "queue",
        "state",
        "attempts_of_max",
        "run_at",
        "claimed_by",
        "claim_deadline",
    )
    list_filter = ("queue", "state", OverdueFilter)
    search_fields = ("worker_id", "last_error")
    ordering = ("-id",)
    list_per_page = 50
    show_full_result_count = False
    actions = ["cancel"]
    readonly_fields = (
        "id",
        "queue",
        "state",
        "attempts",
        "max_attempts",
        "priority",
        "enqueued_at",
        "run_at",
        "worker_id",
        "claim_expires_at",
        "expires_at",
        "visibility_timeout_s",
        "retry_base_s",
        "last_error",
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
        when = date_format(localtime(obj.claim_expires_at), "DATETIME_FORMAT")
        if getattr(obj, "is_overdue", False):
            return format_html("{} " + MARK, when, "alk-overdue", "overdue")
        return when

    @admin.display(description="payload")
    def payload_pretty(self, obj: Job) -> str:
        return _pre(json.dumps(obj.payload, indent=2, ensure_ascii=False, sort_keys=True))

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return _has_perm(request, self.opts, "delete")

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Live jobs leave only through "cancel" (one statement, any number of rows).
        return False

    @admin.action(description="Cancel selected jobs", permissions=["cancel"])
    def cancel(self, request: HttpRequest, queryset: QuerySet) -> None:
        ids = list(queryset.values_list("pk", flat=True))
        cancelled = operations.cancel_jobs(ids, using=queryset.db)
        self.message_user(request, f"Cancelled {cancelled} job(s).")


@admin.register(Schedule)
class ScheduleAdmin(AlkstoreModelAdmin):
    list_display = ("name", "spec", "queue", "enabled", "next_run_at", "last_fired_at")
    list_filter = ("enabled", "queue")
    search_fields = ("name", "queue")
    ordering = ("name",)
    actions = ["enable", "disable"]

    def has_toggle_permission(self, request: HttpRequest) -> bool:
        return _has_perm(request, self.opts, "change")

    @admin.action(description="Enable (resume) selected schedules", permissions=["toggle"])
    def enable(self, request: HttpRequest, queryset: QuerySet) -> None:
        ids = list(queryset.values_list("pk", flat=True))
        changed = operations.set_schedules_enabled(ids, True, using=queryset.db)
        self.message_user(request, f"Enabled {changed} schedule(s).")

    @admin.action(description="Disable (pause) selected schedules", permissions=["toggle"])
    def disable(self, request: HttpRequest, queryset: QuerySet) -> None:
        ids = list(queryset.values_list("pk", flat=True))
        changed = operations.set_schedules_enabled(ids, False, using=queryset.db)
        self.message_user(request, f"Disabled {changed} schedule(s).")


@admin.register(Lock)
class LockAdmin(AlkstoreModelAdmin):
    list_display = ("name", "owner", "fence", "acquired_at", "expires_at", "lease")
    search_fields = ("name", "owner")
    ordering = ("name",)
    actions: list[Any] = []

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        expired = Case(
            When(expires_at__lte=Now(), then=Value(True)),
            default=Value(False),
            output_field=BooleanField(),
        )
        return super().get_queryset(request).annotate(is_expired=expired)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Deleting a lease would restart its fencing token: locks are only shown.
        return False

    @admin.display(description="lease", ordering="is_expired")
    def lease(self, obj: Lock) -> str:
        if getattr(obj, "is_expired", False):
            return format_html(MARK, "alk-expired", "expired")
        return "held"


# Django Tasks results, next to the jobs (kept in their own module).
from . import tasks_admin  # noqa: E402, F401
