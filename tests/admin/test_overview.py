"""The queue overview page: per-queue counts and the outcomes chart."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from alkstore_django import store
from alkstore_django.throughput import record_throughput
from tests.factories import DeadJobFactory
from tests.helpers import lapse_claim

pytestmark = pytest.mark.django_db


def test_overview__renders_counts_per_queue(admin_client):
    queue = store.queue("ov.q")
    queue.enqueue_many([1, 2, 3])
    queue.enqueue(4, delay_s=3600)
    handle = queue.claim_one("w")
    lapse_claim(handle.job.id)
    DeadJobFactory.create_batch(2, queue="ov.q")
    response = admin_client.get(reverse("admin:alkstore_django_overview"))
    assert response.status_code == 200
    rows = {s.queue: s for s, *_ in response.context["rows"]}
    stats = rows["ov.q"]
    assert (stats.pending, stats.scheduled, stats.processing, stats.overdue, stats.dead) == (
        2, 1, 1, 1, 2,
    )  # fmt: skip
    html = response.content.decode()
    assert 'data-queue="ov.q"' in html
    assert "<svg" in html


def test_overview__chart_shows_finished_and_dead_lettered_minutes(admin_client):
    record_throughput(connection.alias, {"ov.q": (5, 1, 0)})
    DeadJobFactory(queue="ov.q", died_at=timezone.now() - timedelta(seconds=1))
    response = admin_client.get(reverse("admin:alkstore_django_overview"))
    chart = response.context["chart"]
    assert (chart.total_acked, chart.total_dead) == (5, 1)
    html = response.content.decode()
    assert 'class="acked"' in html and 'class="dead"' in html
    assert 'src="http' not in html and 'href="http' not in html  # no CDN


def test_overview__escapes_queue_names(admin_client):
    DeadJobFactory(queue="<b>q</b>")
    html = admin_client.get(reverse("admin:alkstore_django_overview")).content.decode()
    assert "<b>q</b>" not in html
    assert "&lt;b&gt;q&lt;/b&gt;" in html


def test_overview__needs_view_permission(staff_client):
    assert staff_client().get(reverse("admin:alkstore_django_overview")).status_code == 403


def test_overview__allowed_with_job_view_permission(staff_client):
    client = staff_client("view_job")
    assert client.get(reverse("admin:alkstore_django_overview")).status_code == 200


def test_overview__does_not_refresh_unless_asked(admin_client):
    html = admin_client.get(reverse("admin:alkstore_django_overview")).content.decode()
    assert 'http-equiv="refresh"' not in html
    assert 'href="?refresh=5"' in html


def test_overview__refresh_reloads_the_page_every_n_seconds(admin_client):
    response = admin_client.get(reverse("admin:alkstore_django_overview"), {"refresh": "15"})
    html = response.content.decode()
    assert '<meta http-equiv="refresh" content="15">' in html
    assert "<strong>every 15 s</strong>" in html
    assert 'href="?">off</a>' in html


@pytest.mark.parametrize("value", ["0", "x", "1.5", "3601", "²"])
def test_overview__a_bad_refresh_is_a_400_naming_it(admin_client, value):
    response = admin_client.get(reverse("admin:alkstore_django_overview"), {"refresh": value})
    assert response.status_code == 400
    assert response.content.decode() == (
        f"Invalid refresh {value!r}: expected whole seconds from 1 to 3600, "
        "or no refresh parameter for none."
    )


def test_overview__flags_a_queue_nobody_consumes_and_counts_recent_time_outs(admin_client):
    from alkstore_django import presence
    from alkstore_django.error_text import timed_out
    from alkstore_django.history import record_attempt

    q = store.queue("ov.orphan")
    q.enqueue("waiting")
    store.queue("ov.slow").enqueue(1)
    handle = store.queue("ov.slow").claim_one("w")
    record_attempt("default", handle.job, timed_out(30))
    presence.announce(
        "default", "w-ov", queues=["ov.slow"], pool="processes", concurrency=1, counts=(0, 0, 0)
    )
    html = admin_client.get(reverse("admin:alkstore_django_overview")).content.decode()
    orphan = html[html.index('data-queue="ov.orphan"') :].split("</tr>")[0]
    assert 'class="alk-unconsumed"' in orphan
    slow = html[html.index('data-queue="ov.slow"') :].split("</tr>")[0]
    assert 'class="alk-unconsumed"' not in slow
    assert '<span class="alk-timed-out">1</span>' in slow
