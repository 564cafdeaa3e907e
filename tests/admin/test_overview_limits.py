"""The overview: a limited queue's limits and rate window, and ``?refresh=`` kept across links."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from alkstore_django import store
from alkstore_django.models import QueueControl

pytestmark = pytest.mark.django_db

OVERVIEW = "admin:alkstore_django_overview"


def state_cell(html: str, queue: str) -> str:
    row = html[html.index(f'data-queue="{queue}"') :].split("</tr>")[0]
    return row[row.index('class="alk-state"') :]


def test_overview__a_limited_queue_shows_its_limits_and_next_window(admin_client, settings):
    settings.ALKSTORE = {
        **settings.ALKSTORE,
        "QUEUES": {
            "ov.rate": {"rate": "2/h"},
            "ov.max": {"max_running": 1},
            "ov.idle": {"rate": "5/m"},
        },
    }
    store.queue("ov.rate").enqueue_many([1, 2, 3])
    assert len(store.queue("ov.rate").claim_batch("w", 5)) == 2  # the window's two starts
    store.queue("ov.max").enqueue_many([1, 2])
    assert store.queue("ov.max").claim_one("w") is not None
    store.queue("ov.plain").enqueue(1)
    html = admin_client.get(reverse(OVERVIEW)).content.decode()
    window_at = QueueControl.objects.get(queue="ov.rate").window_at
    ends = timezone.localtime(window_at + timedelta(hours=1))
    rate = state_cell(html, "ov.rate")  # before the fix: "running", nothing more
    assert "rate 2/h: 2 of 2 started, claims wait for next window at" in rate
    assert f"{ends:%Y-%m-%d %H:%M:%S}</time>" in rate
    assert 'class="alk-rate alk-warn"' in rate
    assert "at most 1 running (full)" in state_cell(html, "ov.max")
    assert "rate 5/m: 0 of 5 started, no window open" in state_cell(html, "ov.idle")
    assert "alk-limits" not in state_cell(html, "ov.plain")


def test_overview__a_keyed_queue_shows_its_limit_per_key(admin_client, settings):
    settings.ALKSTORE = {
        **settings.ALKSTORE,
        "QUEUES": {"ov.keyed": {"max_running_per_key": 2, "max_running": 10}},
    }
    store.queue("ov.keyed").enqueue(1, concurrency_key="customer:7")
    cell = state_cell(admin_client.get(reverse(OVERVIEW)).content.decode(), "ov.keyed")
    assert "at most 10 running</span>; <span" in cell
    assert "at most 2 running per concurrency key" in cell


def test_overview__pause_button_keeps_the_auto_refresh(admin_client):
    store.queue("ov.r").enqueue(1)
    html = admin_client.get(reverse(OVERVIEW), {"refresh": "15"}).content.decode()
    assert '<input type="hidden" name="refresh" value="15">' in state_cell(html, "ov.r")
    response = admin_client.post(
        reverse("admin:alkstore_django_queue_control"),
        {"queue": "ov.r", "action": "pause", "refresh": "15"},
    )
    assert response.status_code == 302
    assert response.url == f"{reverse(OVERVIEW)}?refresh=15"  # before the fix: refresh dropped


@pytest.mark.parametrize(
    ("query", "target"), [("?refresh=5", "?refresh=5"), ("", ""), ("?refresh=0", "")]
)
def test_index_entry__redirects_to_the_overview_keeping_a_valid_refresh(
    admin_client, query, target
):
    entry = reverse("admin:alkstore_django_queueoverview_changelist")
    response = admin_client.get(entry + query)
    assert response.status_code == 302
    assert response.url == reverse(OVERVIEW) + target
