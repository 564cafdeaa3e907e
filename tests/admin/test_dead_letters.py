"""The dead-letter admin: list, detail, requeue and delete, History, and who may do what."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.urls import reverse
from django.utils import timezone

from alkstore_django.models import DeadJob, Job
from tests.factories import DeadJobFactory
from tests.helpers import post_action

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:alkstore_django_deadjob_changelist"


def changelist_url() -> str:
    return reverse(CHANGELIST)


def detail_url(job_id: int) -> str:
    return reverse("admin:alkstore_django_deadjob_change", args=[job_id])


def requeue_url(job_id: int) -> str:
    return reverse("admin:alkstore_django_deadjob_requeue", args=[job_id])


def history(model, job_id: int) -> list[tuple[int, str]]:
    entries = LogEntry.objects.filter(
        content_type__app_label="alkstore_django",
        content_type__model=model._meta.model_name,
        object_id=str(job_id),
    )
    return [(e.action_flag, e.change_message) for e in entries]


def test_changelist__shows_queue_attempts_truncated_error_and_died_at(admin_client):
    died_at = timezone.now().replace(microsecond=0) - timedelta(seconds=7)
    DeadJobFactory(queue="emails", attempts=5, last_error="E" * 300, died_at=died_at)
    response = admin_client.get(changelist_url())
    assert response.status_code == 200
    html = response.content.decode()
    assert "emails" in html
    assert "E" * 79 + "…" in html
    assert "E" * 300 not in html
    assert "Queue overview" in html
    # To the second, not Django's minute-resolution DATETIME_FORMAT.
    assert f'<td class="field-died_at">{died_at:%Y-%m-%d %H:%M:%S}</td>' in html


def test_changelist__filters_by_queue_and_died_at(admin_client):
    DeadJobFactory(queue="a", last_error="in a")
    DeadJobFactory(queue="b", last_error="in b", died_at=timezone.now() - timedelta(days=30))
    response = admin_client.get(changelist_url(), {"queue": "a"})
    assert list(response.context["cl"].result_list.values_list("queue", flat=True)) == ["a"]
    since = str(timezone.now() - timedelta(days=7))  # the filter's own "past 7 days" form
    response = admin_client.get(changelist_url(), {"died_at__gte": since})
    assert list(response.context["cl"].result_list.values_list("queue", flat=True)) == ["a"]


def test_changelist__searches_error_text_and_exact_id(admin_client):
    timeout = DeadJobFactory(last_error="TimeoutError: smtp")
    other = DeadJobFactory(last_error="KeyError: 'x'")
    response = admin_client.get(changelist_url(), {"q": "smtp"})
    assert [d.id for d in response.context["cl"].result_list] == [timeout.id]
    response = admin_client.get(changelist_url(), {"q": str(other.id)})
    assert [d.id for d in response.context["cl"].result_list] == [other.id]


def test_detail__pretty_prints_payload_and_shows_full_error_read_only(admin_client):
    dead = DeadJobFactory(payload={"to": "a@example.com", "n": [1, 2]}, last_error="line1\nline2")
    url = reverse("admin:alkstore_django_deadjob_change", args=[dead.id])
    response = admin_client.get(url)
    assert response.status_code == 200
    html = response.content.decode()
    assert "&quot;to&quot;: &quot;a@example.com&quot;" in html
    assert "line1\nline2" in html
    assert 'name="_save"' not in html


def test_detail__escapes_html_in_payload_and_error(admin_client):
    dead = DeadJobFactory(
        payload={"body": "<script>alert(1)</script>"}, last_error="<img src=x onerror=alert(2)>"
    )
    html = admin_client.get(reverse("admin:alkstore_django_deadjob_change", args=[dead.id]))
    html = html.content.decode()
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<img src=x" not in html
    listing = admin_client.get(changelist_url()).content.decode()
    assert "<img src=x" not in listing


def test_requeue_action__moves_rows_back_pending_with_same_id_and_records_history(admin_client):
    dead = DeadJobFactory(queue="emails", attempts=3, last_error="boom")
    kept = DeadJobFactory(queue="emails")
    response = post_action(admin_client, changelist_url(), "requeue", [dead.id])
    assert response.status_code == 302
    job = Job.objects.get(id=dead.id)
    assert (job.queue, job.state, job.attempts, job.last_error) == ("emails", "pending", 0, "boom")
    assert job.payload == dead.payload
    assert not DeadJob.objects.filter(id=dead.id).exists()
    assert DeadJob.objects.filter(id=kept.id).exists()
    messages = [str(m) for m in response.wsgi_request._messages]
    assert messages == ["Requeued 1 dead letter(s): pending, due now."]
    assert history(DeadJob, dead.id) == [(CHANGE, "Requeued: pending, due now.")]
    assert history(DeadJob, kept.id) == []


def test_delete_action__asks_for_confirmation_then_deletes_and_records_history(admin_client):
    doomed = DeadJobFactory.create_batch(3)
    kept = DeadJobFactory()
    asked = post_action(admin_client, changelist_url(), "delete_selected", [d.id for d in doomed])
    assert asked.status_code == 200
    assert "admin/delete_selected_confirmation.html" in [t.name for t in asked.templates]
    assert DeadJob.objects.count() == 4  # nothing deleted before the confirmation
    done = post_action(
        admin_client, changelist_url(), "delete_selected", [d.id for d in doomed], post="yes"
    )
    assert done.status_code == 302
    assert list(DeadJob.objects.values_list("id", flat=True)) == [kept.id]
    assert not Job.objects.exists()
    assert [str(m) for m in done.wsgi_request._messages] == ["Successfully deleted 3 dead letters."]
    assert all(history(DeadJob, d.id) == [(DELETION, "")] for d in doomed)


def test_detail_delete__confirms_first_then_deletes(admin_client):
    dead = DeadJobFactory()
    url = reverse("admin:alkstore_django_deadjob_delete", args=[dead.id])
    assert "Are you sure" in admin_client.get(url).content.decode()
    assert DeadJob.objects.filter(id=dead.id).exists()
    assert admin_client.post(url, {"post": "yes"}).status_code == 302
    assert not DeadJob.objects.filter(id=dead.id).exists()
    assert [flag for flag, _ in history(DeadJob, dead.id)] == [DELETION]


def test_detail_requeue_button__requeues_and_follows_the_job(admin_client):
    dead = DeadJobFactory(queue="emails", last_error="boom")
    page = admin_client.get(detail_url(dead.id)).content.decode()
    assert f'action="{requeue_url(dead.id)}"' in page
    assert 'name="csrfmiddlewaretoken"' in page
    response = admin_client.post(requeue_url(dead.id))
    assert response.status_code == 302
    assert response.url == reverse("admin:alkstore_django_job_change", args=[dead.id])
    job = Job.objects.get(id=dead.id)
    assert (job.queue, job.state, job.attempts) == ("emails", "pending", 0)
    assert not DeadJob.objects.filter(id=dead.id).exists()
    assert [str(m) for m in response.wsgi_request._messages] == [
        f"Requeued dead letter {dead.id}: pending, due now."
    ]
    assert history(DeadJob, dead.id) == [(CHANGE, "Requeued: pending, due now.")]


def test_detail_requeue_button__a_gone_dead_letter_is_a_warning_not_an_error(admin_client):
    dead = DeadJobFactory()
    url = requeue_url(dead.id)
    dead.delete()
    response = admin_client.post(url)
    assert response.status_code == 302 and response.url == changelist_url()
    (message,) = response.wsgi_request._messages
    assert "is gone (requeued or deleted meanwhile): nothing requeued." in str(message)
    assert history(DeadJob, dead.id) == []


def test_detail_requeue_button__post_only_and_permission_guarded(staff_client):
    dead = DeadJobFactory()
    viewer = staff_client("view_deadjob", "delete_deadjob")
    assert requeue_url(dead.id) not in viewer.get(detail_url(dead.id)).content.decode()
    assert viewer.post(requeue_url(dead.id)).status_code == 403
    assert DeadJob.objects.filter(id=dead.id).exists()
    requeuer = staff_client("view_deadjob", "requeue_deadjob")
    assert requeue_url(dead.id) in requeuer.get(detail_url(dead.id)).content.decode()
    assert requeuer.get(requeue_url(dead.id)).status_code == 405
    response = requeuer.post(requeue_url(dead.id))
    # Without view_job the operator goes back to the dead letters.
    assert response.status_code == 302 and response.url == changelist_url()
    assert Job.objects.filter(id=dead.id, state="pending").exists()


def test_staff_without_requeue_permission__action_absent_and_forged_post_refused(staff_client):
    client = staff_client("view_deadjob", "delete_deadjob")
    dead = DeadJobFactory()
    response = client.get(changelist_url())
    assert response.status_code == 200
    choices = [name for name, _ in response.context["action_form"].fields["action"].choices]
    assert "requeue" not in choices
    assert "delete_selected" in choices
    response = post_action(client, changelist_url(), "requeue", [dead.id])
    assert response.status_code == 302
    assert DeadJob.objects.filter(id=dead.id).exists()
    assert not Job.objects.filter(id=dead.id).exists()


def test_staff_with_requeue_permission__may_requeue_but_not_delete(staff_client):
    client = staff_client("view_deadjob", "requeue_deadjob")
    dead = DeadJobFactory()
    response = client.get(changelist_url())
    choices = [name for name, _ in response.context["action_form"].fields["action"].choices]
    assert "requeue" in choices
    assert "delete_selected" not in choices
    post_action(client, changelist_url(), "delete_selected", [dead.id], post="yes")
    assert DeadJob.objects.filter(id=dead.id).exists()
    post_action(client, changelist_url(), "requeue", [dead.id])
    assert Job.objects.filter(id=dead.id, state="pending").exists()


def test_staff_without_view_permission__cannot_see_dead_letters(staff_client):
    client = staff_client()
    assert client.get(changelist_url()).status_code == 403


@pytest.mark.django_db(transaction=True)
def test_detail__shows_every_failed_attempt(admin_client):
    from alkstore_django import store
    from alkstore_django.testing import run_ready_jobs
    from tests.helpers import make_due

    job_id = store.queue("t.raise", max_attempts=3).enqueue("p")
    for _ in range(3):
        run_ready_jobs(["t.raise"], worker_id="history-w")
        make_due(job_id)
    url = reverse("admin:alkstore_django_deadjob_change", args=[job_id])
    html = admin_client.get(url).content.decode()
    for attempt in (1, 2, 3):
        assert f"attempt {attempt} · " in html
    assert html.count("ValueError: boom p") >= 3
    assert "history-w" in html
