"""The queue overview: per-queue counts and jobs finished per minute for an hour.

Served at ``deadjob/overview/`` (URL name ``alkstore_django_overview``), under
the dead letters' admin, where operators first came to look; the index's
"queue overview" entry (``QueueOverviewAdmin``, a proxy model) redirects there.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path

from .. import operations
from ..conf import app_settings
from ..display import format_age, throughput_chart
from ..models import DeadJob, Job, QueueOverview
from ..throughput import recent_throughput
from .base import AlkstoreModelAdmin
from .base import has_perm as _has_perm
from .queue_controls import can_pause_queues, overview_url, refresh_seconds

CHART_MINUTES = 60
REFRESH_CHOICES_S = (5, 15, 60)


def can_view_overview(request: HttpRequest) -> bool:
    """The overview shows live and dead counts: either view permission is enough."""
    return _has_perm(request, DeadJob._meta, "view") or _has_perm(request, Job._meta, "view")


class OverviewViews(AlkstoreModelAdmin):
    """The overview page, mixed into the admin whose URLs serve it (the dead letters')."""

    def overview_urls(self) -> list[URLPattern]:
        """Return the overview's URL (``overview/``), ahead of the model's own."""
        overview = self.admin_site.admin_view(self.overview_view)
        return [path("overview/", overview, name="alkstore_django_overview")]

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
        limits = operations.queue_limit_states(using=using)
        rows = [(s, format_age(s.oldest_pending_age_s), limits.get(s.queue)) for s in stats]
        context = {
            **self.admin_site.each_context(request),
            "title": "Queue overview",
            "opts": self.opts,
            "app_label": self.opts.app_label,
            "rows": rows,
            "chart": throughput_chart(recent_throughput(using, CHART_MINUTES)),
            "chart_minutes": CHART_MINUTES,
            "refresh_s": refresh_s,
            "refresh_choices_s": REFRESH_CHOICES_S,
            "can_pause": can_pause_queues(request),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/alkstore_django/overview.html", context)


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
        return HttpResponseRedirect(overview_url(request.GET.get("refresh")))
