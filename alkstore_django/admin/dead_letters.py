"""The dead letters: listed, shown with their attempt history, requeued or deleted.

Read-only by default. Every action is one service call (``operations``), a
History entry (``LogEntry``) and a message; each is guarded by its own
permission, so an action a user may not run is neither offered nor accepted
from a forged POST. Deleting dead letters goes through Django's own
confirmation page. The overview and its queue controls are served under
this admin's URLs (``overview.py``, ``queue_controls.py``).
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import DateFieldListFilter
from django.contrib.admin.actions import delete_selected
from django.contrib.admin.utils import unquote
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, reverse

from .. import operations
from ..conf import app_settings
from ..display import error_summary, format_timestamp
from ..history import attempts_of
from ..models import DeadJob, Job
from .base import AlkstoreModelAdmin, JobIdSearchMixin, TagFilter, TagsMixin, workflow_step_link
from .base import has_perm as _has_perm
from .base import pre as _pre
from .overview import OverviewViews
from .queue_controls import QueueControlViews
from .results import kept_result

REQUEUED = "Requeued: pending, due now."


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
class DeadJobAdmin(
    OverviewViews, QueueControlViews, TagsMixin, JobIdSearchMixin, AlkstoreModelAdmin
):
    list_display = ("id", "queue", "attempts", "error_preview", "died_at", "tag_list")
    list_filter = (DeadQueueFilter, ("died_at", DateFieldListFilter), TagFilter)
    search_fields = ("last_error",)
    search_help_text = "Error text, a job id, or tag:TAG (a lone tag matches too)."
    ordering = ("-died_at",)
    list_per_page = 50
    # The unfiltered total is a second count(*) per request; the filtered one is enough.
    show_full_result_count = False
    # Django's own delete action: its confirmation page, then delete_queryset below.
    actions = ["requeue", delete_selected]
    page_buttons = {"can_requeue": "has_requeue_permission"}
    fields = (
        "id",
        "queue",
        "workflow_step",
        "died_at",
        "attempts",
        "error_full",
        "attempt_history",
        "result_kept",
        "payload_pretty",
        "max_attempts",
        "priority",
        "enqueued_at",
        "run_at",
        "worker_id",
        "expires_at",
        "timeout_s",
        "unique_key",
        "tag_list",
    )
    readonly_fields = fields

    @admin.display(description="error")
    def error_preview(self, obj: DeadJob) -> str:
        return error_summary(obj.last_error)

    @admin.display(description="error")
    def error_full(self, obj: DeadJob) -> str:
        return _pre(obj.last_error or "")

    @admin.display(description="workflow")
    def workflow_step(self, obj: DeadJob) -> str:
        return workflow_step_link(obj.workflow_id, obj.step)

    @admin.display(description="kept result")
    def result_kept(self, obj: DeadJob) -> str:
        return kept_result(obj)

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

    def requeue_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The detail page's Requeue button: POST only, with the requeue permission."""
        dead = self.button_target(request, object_id, self.has_requeue_permission(request))
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
        return [
            *self.overview_urls(),
            *self.queue_control_urls(),
            self.button_url("requeue", self.requeue_view, "alkstore_django_deadjob_requeue"),
            *super().get_urls(),
        ]
