"""The live-workers admin page."""

from __future__ import annotations

import pytest
from django.urls import reverse

from alkstore_django import presence
from alkstore_django.models import LiveWorker

pytestmark = pytest.mark.django_db


def test_live_workers__lists_workers_seen_within_the_ttl_only(admin_client):
    presence.announce(
        "default", "w-live", queues=["a", "b"], pool="threads", concurrency=4, counts=(5, 1, 0)
    )
    presence.announce(
        "default", "w-gone", queues=["a"], pool="processes", concurrency=2, counts=(0, 0, 0)
    )
    from datetime import timedelta

    from django.db.models.functions import Now

    LiveWorker.objects.filter(worker_id="w-gone").update(last_seen_at=Now() - timedelta(hours=1))
    html = admin_client.get(reverse("admin:alkstore_django_liveworker_changelist")).content.decode()
    html = html.replace("<wbr>", "")  # the long-word break opportunities
    assert "w-live" in html and "a, b" in html
    assert "w-gone" not in html


def test_live_workers__offer_no_add_or_delete(admin_client):
    presence.announce(
        "default", "w1", queues=["a"], pool="threads", concurrency=1, counts=(0, 0, 0)
    )
    html = admin_client.get(reverse("admin:alkstore_django_liveworker_changelist")).content.decode()
    assert "liveworker/add/" not in html and 'name="action"' not in html
