"""Cancel a live job from the admin, running or not: the change page's button and a list action.

Both call ``cancels.cancel_job`` (a pending job is deleted, a running one is
asked to stop and ends ``cancelled``), record a History entry and say what
happened to each job. They need the permission the plain cancel action needs
(``delete_job``: a cancelled job leaves the live table).
"""

from __future__ import annotations

from collections import Counter

from django.contrib import admin, messages
from django.contrib.admin.models import DELETION
from django.contrib.admin.utils import unquote
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, reverse

from ..queues.cancels import CancelResult, cancel_job, cancel_jobs
from ..store import Store
from .base import AlkstoreModelAdmin
from .base import has_perm as _has_perm

CANCELLED = "Cancelled."
REQUESTED = "Cancel requested: its worker stops it."


class CancelButtonAdmin(AlkstoreModelAdmin):
    """The live jobs' admin base: a Cancel button on a job's page, a cancel-running action."""

    page_buttons = {"can_cancel": "has_cancel_permission"}

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return _has_perm(request, self.opts, "delete")

    @admin.action(description="Cancel selected jobs (stop running ones)", permissions=["cancel"])
    def cancel_running(self, request: HttpRequest, queryset: QuerySet) -> None:
        selected = list(queryset.only("id", "queue", "state"))
        done = cancel_jobs(Store(queryset.db), [j.pk for j in selected])
        counts = Counter(done.values())
        self.log_action(
            request, [j for j in selected if done[j.pk] == CancelResult.CANCELLED], CANCELLED,
            flag=DELETION,
        )  # fmt: skip
        self.log_action(
            request, [j for j in selected if done[j.pk] == CancelResult.REQUESTED], REQUESTED
        )
        message = (
            f"Cancelled {counts[CancelResult.CANCELLED]} job(s); asked the workers running "
            f"{counts[CancelResult.REQUESTED]} to stop them (they end cancelled)."
        )
        if counts[None]:
            message += f" {counts[None]} had already finished."
        self.message_user(request, message)

    def cancel_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The job page's Cancel button: POST only, with the cancel permission."""
        job = self.button_target(request, object_id, self.has_cancel_permission(request))
        changelist = reverse("admin:alkstore_django_job_changelist")
        result = None if job is None else cancel_job(Store(job._state.db), job.pk)
        if job is None or result is None:
            self.message_user(
                request,
                f"Job {unquote(object_id)!r} is no longer live (it finished or was cancelled "
                "meanwhile): nothing cancelled.",
                messages.WARNING,
            )
            return HttpResponseRedirect(changelist)
        if result == CancelResult.CANCELLED:
            self.log_action(request, [job], CANCELLED, flag=DELETION)
            self.message_user(request, f"Cancelled job {job.pk}: it had not started.")
            return HttpResponseRedirect(changelist)
        self.log_action(request, [job], REQUESTED)
        self.message_user(
            request,
            f"Asked the worker running job {job.pk} to stop it: it ends cancelled within its "
            "queue's cancel_grace_s.",
        )
        return HttpResponseRedirect(reverse("admin:alkstore_django_job_change", args=[job.pk]))

    def get_urls(self) -> list[URLPattern]:
        return [
            self.button_url("cancel", self.cancel_view, "alkstore_django_job_cancel"),
            *super().get_urls(),
        ]
