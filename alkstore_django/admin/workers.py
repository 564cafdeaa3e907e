"""The live-workers page: every worker that announced itself within ``WORKER_TTL_S``.

Registered when ``admin/__init__`` imports it. Rows are written by the workers themselves
(``presence.py``); a worker that died without its sentinel stops being listed
once its row is older than the TTL.
"""

from __future__ import annotations

from datetime import timedelta

from django.contrib import admin
from django.db.models import QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join

from ..conf import app_settings
from ..models import LiveWorker
from .base import AlkstoreModelAdmin, breakable


@admin.register(LiveWorker)
class LiveWorkerAdmin(AlkstoreModelAdmin):
    # Fits a 1280 px window beside the nav sidebar and the filters: the default
    # worker id names the host and pid, the pool its size, one cell the counts.
    list_display = ("worker", "queue_names", "pool_size", "jobs", "started_at", "last_seen_at")
    list_filter = ("pool", "host")
    search_fields = ("worker_id", "host")
    ordering = ("worker_id",)
    fields = (
        "worker_id",
        "host",
        "pid",
        "queue_names",
        "pool",
        "concurrency",
        "acked",
        "retried",
        "dead",
        "started_at",
        "last_seen_at",
    )
    readonly_fields = fields
    actions = None

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        cutoff = Now() - timedelta(seconds=app_settings.worker_ttl_s)
        return super().get_queryset(request).filter(last_seen_at__gte=cutoff)

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        # A worker leaves the list by stopping (or by falling silent), not by a click.
        return False

    @admin.display(description="worker id", ordering="worker_id")
    def worker(self, obj: LiveWorker) -> str:
        return breakable(obj.worker_id)

    @admin.display(description="queues")
    def queue_names(self, obj: LiveWorker) -> str:
        return format_html_join(", ", "{}", ((breakable(name),) for name in obj.queues))

    @admin.display(description="pool", ordering="pool")
    def pool_size(self, obj: LiveWorker) -> str:
        return f"{obj.pool}, {obj.concurrency} slots"

    @admin.display(description="jobs", ordering="acked")
    def jobs(self, obj: LiveWorker) -> str:
        return format_html("{} acked<br>{} retried<br>{} dead", obj.acked, obj.retried, obj.dead)
