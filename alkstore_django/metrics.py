"""Prometheus exposition of what the database knows: queues, live workers, the scheduler.

Mount the view in the site's URLconf (needs the ``metrics`` extra)::

    from alkstore_django.metrics import metrics_view

    urlpatterns = [path("alkstore/metrics", metrics_view), ...]

It answers staff users, or any request carrying ``Authorization: Bearer
<ALKSTORE["METRICS_TOKEN"]>`` when that setting is set (for a scraper that
has no session). Every figure is read at scrape time from the alkstore tables
(a few grouped queries), so any web process can serve it and the figures are
the same whichever one is scraped. A worker's own run-time and claim-latency
histograms live in the worker process: ``runworker --metrics-port``.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from typing import Any

from django.http import HttpRequest, HttpResponse, HttpResponseForbidden

from . import presence
from .conf import app_settings
from .models import Lock, Schedule
from .overview import every_queue_overview, queue_overview
from .scheduler.leader import LEADER_LOCK

QUEUE_STATES = ("pending", "scheduled", "processing", "overdue", "dead")


class StoreCollector:
    """A Prometheus collector that reads the alkstore tables of ``using`` at each scrape."""

    def __init__(self, using: str | None = None) -> None:
        self.using = using

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        aliases = [self.using] if self.using else app_settings.aliases
        jobs = GaugeMetricFamily(
            "alkstore_queue_jobs", "Jobs per queue and state.", labels=["queue", "state"]
        )
        age = GaugeMetricFamily(
            "alkstore_queue_oldest_pending_age_seconds",
            "How long the oldest ready job of the queue has waited.",
            labels=["queue"],
        )
        consumers = GaugeMetricFamily(
            "alkstore_queue_consumers", "Live workers consuming the queue.", labels=["queue"]
        )
        rows = queue_overview(using=self.using) if self.using else every_queue_overview()
        for stats in rows:
            for state in QUEUE_STATES:
                jobs.add_metric([stats.queue, state], getattr(stats, state))
            age.add_metric([stats.queue], stats.oldest_pending_age_s or 0.0)
            consumers.add_metric([stats.queue], stats.consumers)
        yield from (jobs, age, consumers)

        settled = CounterMetricFamily(
            "alkstore_worker_jobs",
            "Jobs each live worker settled since it started, by outcome.",
            labels=["worker_id", "outcome"],
        )
        seen = GaugeMetricFamily(
            "alkstore_worker_last_seen_timestamp_seconds",
            "When each live worker last announced itself.",
            labels=["worker_id"],
        )
        # A worker serving queues on several aliases has a row on each (``crew.py``):
        # one series per worker, its loops' counts summed.
        totals: dict[str, list[float]] = {}
        for alias in aliases:
            for worker in presence.live_workers(alias):
                total = totals.setdefault(worker.worker_id, [0, 0, 0, 0.0])
                for i, outcome in enumerate(("acked", "retried", "dead")):
                    total[i] += getattr(worker, outcome)
                total[3] = max(total[3], worker.last_seen_at.timestamp())
        for worker_id, (acked, retried, dead, last_seen) in totals.items():
            for outcome, count in (("acked", acked), ("retried", retried), ("dead", dead)):
                settled.add_metric([worker_id, outcome], count)
            seen.add_metric([worker_id], last_seen)
        yield from (settled, seen)

        leader = GaugeMetricFamily(
            "alkstore_scheduler_leader_lease_expires_timestamp_seconds",
            "When the scheduler leader's lease ends (absent when no runner ever led).",
            labels=["owner"],
        )
        # The scheduler's tables are DATABASE's (a schedule fires into any alias).
        using = self.using or app_settings.database
        lease = Lock.objects.using(using).filter(name=LEADER_LOCK).first()
        if lease is not None:
            leader.add_metric([lease.owner], lease.expires_at.timestamp())
        fired = GaugeMetricFamily(
            "alkstore_schedule_last_fire_timestamp_seconds",
            "When each schedule last fired.",
            labels=["schedule"],
        )
        for name, last in Schedule.objects.using(using).values_list("name", "last_fired_at"):
            if last is not None:
                fired.add_metric([name], last.timestamp())
        yield from (leader, fired)


def _allowed(request: HttpRequest) -> bool:
    token = app_settings.metrics_token
    if token:
        given = request.headers.get("Authorization", "")
        if hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            return True
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_active and user.is_staff)


def metrics_view(request: HttpRequest) -> HttpResponse:
    """Serve the store's metrics in the Prometheus text format (staff or bearer token)."""
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    if not _allowed(request):
        return HttpResponseForbidden("alkstore metrics: staff login or METRICS_TOKEN required\n")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
