"""The operators' admin: dead letters, live jobs, schedules, locks and the queue overview.

Read-only by default. Every action is one service call (``operations``), a
History entry (``LogEntry``) and a message; each is guarded by its own
permission, so an action a user may not run is neither offered nor accepted
from a forged POST. Deleting dead letters goes through Django's own
confirmation page.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import DateFieldListFilter
from django.contrib.admin.actions import delete_selected
from django.contrib.admin.models import CHANGE, DELETION
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db.models import BooleanField, Case, Q, QuerySet, Value, When
from django.db.models.functions import Now
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html

from .. import operations
from ..conf import app_settings
from ..display import error_summary, format_age, format_timestamp, outcome_chart
from ..errors import AlkstoreError
from ..history import attempts_of
from ..models import DeadJob, Job, JobState, Lock, QueueControl, QueueOverview
from ..throughput import recent_outcomes
from .base import AlkstoreModelAdmin, JobIdSearchMixin
from .base import has_perm as _has_perm
from .base import pre as _pre

CHART_MINUTES = 60
MARK = '<strong class="{}" style="color: #ba2121">{}</strong>'
REFRESH_CHOICES_S = (5, 15, 60)
MAX_REFRESH_S = 3600
REQUEUED = "Requeued: pending, due now."
CONTROL_ACTIONS = {"pause": True, "resume": False}


def can_view_overview(request: HttpRequest) -> bool:
    """The overview shows live and dead counts: either view permission is enough."""
    return _has_perm(request, DeadJob._meta, "view") or _has_perm(request, Job._meta, "view")


def can_pause_queues(request: HttpRequest) -> bool:
    """Pausing and resuming queues needs ``change_queuecontrol``."""
    return _has_perm(request, QueueControl._meta, "change")


def refresh_seconds(raw: str | None) -> int | None:
    """Return the overview's ``?refresh=`` seconds (None: off); raise ValueError naming bad ones."""
    if raw is None or raw == "":
        return None
    if not (raw.isascii() and raw.isdigit() and 1 <= int(raw) <= MAX_REFRESH_S):
        raise ValueError(
            f"Invalid refresh {raw!r}: expected whole seconds from 1 to {MAX_REFRESH_S}, "
            "or no refresh parameter for none."
        )
    return int(raw)


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
    # Django's own delete action: its confirmation page, then delete_queryset below.
    actions = ["requeue", delete_selected]
    fields = (
        "id",
        "queue",
        "died_at",
        "attempts",
        "error_full",
        "attempt_history",
        "payload_pretty",
        "max_attempts",
        "priority",
        "enqueued_at",
        "run_at",
        "worker_id",
        "expires_at",
        "timeout_s",
        "unique_key",
    )
    readonly_fields = fields

    @admin.display(description="error")
    def error_preview(self, obj: DeadJob) -> str:
        return error_summary(obj.last_error)

    @admin.display(description="error")
    def error_full(self, obj: DeadJob) -> str:
        return _pre(obj.last_error or "")

    @admin.display(description="payload")
    def payload_pretty(self, obj: DeadJob) -> str:
        return _pre(json.dumps(obj.payload, indent=2, ensure_ascii=False, sort_keys=True))

    @admin.display(description="attempt history")
    def attempt_history(self, obj: DeadJob) -> str:
        """Every failed attempt: when, on which worker, the error and the traceback's tail."""
        history = attempts_of(obj.pk, app_settings.database)
        if not history:
            return "-"
        return _pre(
            "\n\n".join(
                f"attempt {a.attempt} · {format_timestamp(a.failed_at)} · {a.worker_id or '-'}\n"
                f"{a.error}" + (f"\n{a.traceback.rstrip()}" if a.traceback else "")
                for a in history
            )
        )

    def has_requeue_permission(self, request: HttpRequest) -> bool:
        return _has_perm(request, self.opts, "requeue")

    @admin.action(description="Requeue selected dead letters", permissions=["requeue"])
    def requeue(self, request: HttpRequest, queryset: QuerySet) -> None:
        selected = list(queryset.only("id", "queue"))
        moved = operations.requeue_dead([d.pk for d in selected], using=queryset.db)
        self.log_action(request, selected, REQUEUED)
        self.message_user(request, f"Requeued {moved} dead letter(s): pending, due now.")

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet) -> None:
        """One statement per 50,000 rows instead of Django's per-object delete."""
        operations.delete_dead(queryset.values_list("pk", flat=True), using=queryset.db)

    def delete_model(self, request: HttpRequest, obj: DeadJob) -> None:
        operations.delete_dead([obj.pk], using=app_settings.database)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        extra = {**(extra_context or {}), "can_requeue": self.has_requeue_permission(request)}
        return super().change_view(request, object_id, form_url, extra)

    def requeue_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The detail page's Requeue button: POST only, with the requeue permission."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_requeue_permission(request):
            raise PermissionDenied
        dead = self.get_object(request, unquote(object_id))
        changelist = reverse("admin:alkstore_django_deadjob_changelist")
        if dead is None or not operations.requeue_dead([dead.pk], using=app_settings.database):
            self.message_user(
                request,
                f"Dead letter {unquote(object_id)!r} is gone (requeued or deleted meanwhile): "
                "nothing requeued.",
                messages.WARNING,
            )
            return HttpResponseRedirect(changelist)
        self.log_action(request, [dead], REQUEUED)
        self.message_user(request, f"Requeued dead letter {dead.pk}: pending, due now.")
        if _has_perm(request, Job._meta, "view"):
            # Same id: the operator follows the job to its run.
            return HttpResponseRedirect(reverse("admin:alkstore_django_job_change", args=[dead.pk]))
        return HttpResponseRedirect(changelist)

    def get_urls(self) -> list[URLPattern]:
        overview = self.admin_site.admin_view(self.overview_view)
        control = self.admin_site.admin_view(self.queue_control_view)
        requeue = self.admin_site.admin_view(self.requeue_view)
        return [
            path("overview/", overview, name="alkstore_django_overview"),
            path("overview/control/", control, name="alkstore_django_queue_control"),
            path("<path:object_id>/requeue/", requeue, name="alkstore_django_deadjob_requeue"),
            *super().get_urls(),
        ]

    def overview_view(self, request: HttpRequest) -> HttpResponse:
        """The queue overview: per-queue counts and jobs finished per minute for an hour.

        ``?refresh=N`` reloads the page every N seconds (1 to 3600; off by default).
        """
        if not can_view_overview(request):
            raise PermissionDenied
        try:
            refresh_s = refresh_seconds(request.GET.get("refresh"))
        except ValueError as exc:
            return HttpResponseBadRequest(str(exc), content_type="text/plain; charset=utf-8")
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
            "refresh_s": refresh_s,
            "refresh_choices_s": REFRESH_CHOICES_S,
            "can_pause": can_pause_queues(request),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/alkstore_django/overview.html", context)

    def queue_control_view(self, request: HttpRequest) -> HttpResponse:
        """The overview's Pause/Resume button: POST ``queue`` and ``action`` (pause, resume)."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not can_pause_queues(request):
            raise PermissionDenied
        queue, action = request.POST.get("queue", ""), request.POST.get("action", "")
        if action not in CONTROL_ACTIONS:
            return HttpResponseBadRequest(
                f"Invalid action {action!r}: expected pause or resume.",
                content_type="text/plain; charset=utf-8",
            )
        using = app_settings.database
        try:
            changed = operations.set_queue_paused(queue, CONTROL_ACTIONS[action], using=using)
        except AlkstoreError as exc:
            return HttpResponseBadRequest(str(exc), content_type="text/plain; charset=utf-8")
        overview = reverse("admin:alkstore_django_overview")
        if not changed:
            state = "paused" if CONTROL_ACTIONS[action] else "running"
            self.message_user(request, f"Queue {queue!r} was already {state}.", messages.WARNING)
            return HttpResponseRedirect(overview)
        control = QueueControl.objects.using(using).get(queue=queue)
        if CONTROL_ACTIONS[action]:
            text = "Paused: workers claim nothing from it; running jobs finish."
        else:
            text = "Resumed: workers claim from it again."
        self.log_action(request, [control], text)
        self.message_user(request, f"Queue {queue!r}: {text}")
        return HttpResponseRedirect(overview)


@admin.register(QueueOverview)
class QueueOverviewAdmin(admin.ModelAdmin):
    """The queue overview's entry on the admin index (a proxy model: no table, no permissions)."""

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return can_view_overview(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        opts = self.opts
        view = self.admin_site.admin_view(self.to_overview)
        return [path("", view, name=f"{opts.app_label}_{opts.model_name}_changelist")]

    def to_overview(self, request: HttpRequest) -> HttpResponse:
        if not can_view_overview(request):
            raise PermissionDenied
        return HttpResponseRedirect(reverse("admin:alkstore_django_overview"))


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
    actions = ["retry_now", "cancel"]
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
        "timeout_s",
        "retry_base_s",
        "last_error",
        "unique_key",
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
            return format_html("{} " + MARK, when, "alk-overdue", "overdue")
        return when

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


@admin.register(QueueControl)
class QueueControlAdmin(AlkstoreModelAdmin):
    """Each queue's pause row and rate window, read-only: the overview's buttons change them.

    Its change page's History lists who paused and resumed the queue.
    """

    list_display = ("queue", "paused", "paused_at", "window_at", "window_starts")
    list_filter = ("paused",)
    search_fields = ("queue",)
    ordering = ("queue",)
    actions: list[Any] = []

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Deleting the row would resume a paused queue behind the History's back.
        return False


# Django Tasks results, the live workers and the schedules, next to the jobs (in modules
# of their own).
