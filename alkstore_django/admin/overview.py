"""The queue overview: per-queue counts and jobs finished per minute for an hour.

Served at ``deadjob/overview/`` (URL name ``alkstore_django_overview``), under
the dead letters' admin, where operators first came to look; the index's
"queue overview" entry (``QueueOverviewAdmin``, a proxy model) redirects there.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path

from ..conf import app_settings
from ..display import format_age, throughput_chart
from ..models import DeadJob, Job, QueueOverview
from ..overview import every_queue_limit_state, every_queue_overview
from ..throughput import ThroughputMinute, recent_throughput
from .base import AlkstoreModelAdmin
from .base import has_perm as _has_perm
from .queue_controls import can_pause_queues, overview_url, refresh_seconds

CHART_MINUTES = 60
REFRESH_CHOICES_S = (5, 15, 60)


def every_throughput(aliases: list[str]) -> list[ThroughputMinute]:
    """Return the last hour's minutes summed over ``aliases`` (each read on its own clock)."""
    per_alias = [recent_throughput(alias, CHART_MINUTES) for alias in aliases]
    if len(per_alias) == 1:
        return per_alias[0]
    return [
        replace(
            minutes[0],
            acked=sum(m.acked for m in minutes),
            retried=sum(m.retried for m in minutes),
            dead=sum(m.dead for m in minutes),
        )
        for minutes in zip(*per_alias, strict=True)
    ]


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
        stats = every_queue_overview()
        limits = every_queue_limit_state()
        rows = [(s, format_age(s.oldest_pending_age_s), limits.get(s.queue)) for s in stats]
        aliases = app_settings.aliases
        context = {
            **self.admin_site.each_context(request),
            "title": "Queue overview",
            "opts": self.opts,
            "app_label": self.opts.app_label,
            "rows": rows,
            "chart": throughput_chart(every_throughput(aliases)),
            # A column naming each queue's database, once there is more than one.
            "databases": len(aliases) > 1,
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
