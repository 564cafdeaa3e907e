"""The live job page's Cancel button and the "stop running ones" action (``Store.cancel_job``)."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.urls import reverse

from alkstore_django import store
from alkstore_django.models import Job
from tests.helpers import post_action

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:alkstore_django_job_changelist"


def cancel_url(job_id: int) -> str:
    return reverse("admin:alkstore_django_job_cancel", args=[job_id])


def test_job_page__shows_the_cancel_button_to_who_may_cancel(staff_client):
    job_id = store.queue("live.q").enqueue({})
    page = reverse("admin:alkstore_django_job_change", args=[job_id])
    html = staff_client("view_job", "delete_job").get(page).content.decode()
    assert f'action="{cancel_url(job_id)}"' in html


def test_job_page__hides_the_button_from_who_may_only_view(staff_client):
    job_id = store.queue("live.q").enqueue({})
    client = staff_client("view_job")
    page = reverse("admin:alkstore_django_job_change", args=[job_id])
    assert cancel_url(job_id) not in client.get(page).content.decode()
    assert client.post(cancel_url(job_id)).status_code == 403
    assert Job.objects.filter(id=job_id).exists()


def test_cancel_button__deletes_a_pending_job_and_logs_it(admin_client):
    job_id = store.queue("live.q").enqueue({})
    response = admin_client.post(cancel_url(job_id))
    assert response.status_code == 302
    assert response.url == reverse(CHANGELIST)
    assert not Job.objects.filter(id=job_id).exists()
    entry = LogEntry.objects.get(object_id=str(job_id))
    assert (entry.action_flag, entry.change_message) == (DELETION, "Cancelled.")


def test_cancel_button__asks_a_running_job_to_stop_and_stays_on_its_page(admin_client):
    queue = store.queue("live.q")
    job_id = queue.enqueue({})
    queue.claim_one("w1")
    response = admin_client.post(cancel_url(job_id))
    assert response.status_code == 302
    assert response.url == reverse("admin:alkstore_django_job_change", args=[job_id])
    job = Job.objects.get(id=job_id)
    assert (job.state, job.cancel_requested_at is not None) == ("processing", True)
    assert LogEntry.objects.get(object_id=str(job_id)).action_flag == CHANGE
    page = admin_client.get(response.url).content.decode()
    assert "Cancel requested" in page


def test_cancel_button__refuses_get_and_warns_about_a_job_gone_meanwhile(admin_client):
    job_id = store.queue("live.q").enqueue({})
    assert admin_client.get(cancel_url(job_id)).status_code == 405
    assert Job.objects.filter(id=job_id).exists()
    response = admin_client.post(cancel_url(job_id + 1000), follow=True)
    assert "is no longer live" in response.content.decode()


def test_cancel_running_action__cancels_pending_and_asks_running_jobs(admin_client):
    queue = store.queue("live.q")
    running = queue.enqueue({})
    assert queue.claim_one("w1").job.id == running
    pending = queue.enqueue({})
    data = {"action": "cancel_running", "_selected_action": [str(pending), str(running)]}
    response = admin_client.post(reverse(CHANGELIST), {**data, "index": "0"}, follow=True)
    assert "Cancelled 1 job(s); asked the workers running 1 to stop them" in (
        response.content.decode()
    )
    assert not Job.objects.filter(id=pending).exists()
    assert Job.objects.get(id=running).cancel_requested_at is not None


def test_cancel_running_action__needs_the_cancel_permission(staff_client):
    job_id = store.queue("live.q").enqueue({})
    client = staff_client("view_job", "change_job")
    post_action(client, reverse(CHANGELIST), "cancel_running", [job_id])
    assert Job.objects.filter(id=job_id).exists()
