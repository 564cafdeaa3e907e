"""The live-job, schedule and lock admins, and the app index link."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.urls import reverse
from django.utils import timezone

from alkstore_django import store
from alkstore_django.models import Job, Schedule
from tests.factories import DeadJobFactory, LockFactory, ScheduleFactory
from tests.helpers import lapse_claim, post_action

pytestmark = pytest.mark.django_db


def test_app_index__links_the_queue_overview(admin_client):
    response = admin_client.get(reverse("admin:app_list", args=["alkstore_django"]))
    assert response.status_code == 200
    assert reverse("admin:alkstore_django_overview") in response.content.decode()


@pytest.mark.parametrize(
    ("codenames", "listed"),
    [(("view_job",), True), (("view_deadjob",), True), (("view_schedule",), False)],
)
def test_admin_index__lists_the_queue_overview_for_who_may_see_it(staff_client, codenames, listed):
    client = staff_client(*codenames)
    entry = reverse("admin:alkstore_django_queueoverview_changelist")
    html = client.get(reverse("admin:index")).content.decode()
    assert (f'href="{entry}"' in html) is listed
    assert ("Queue overview" in html) is listed
    response = client.get(entry)
    if listed:
        assert response.status_code == 302
        assert response.url == reverse("admin:alkstore_django_overview")
    else:
        assert response.status_code == 403


def test_changelists__show_times_to_the_second(admin_client):
    died_at = timezone.now().replace(microsecond=0) - timedelta(seconds=13)
    DeadJobFactory(died_at=died_at)
    LockFactory(name="a-lock", acquired_at=died_at)
    ScheduleFactory(name="a-schedule", next_run_at=died_at)
    store.queue("live.q").enqueue(1, run_at=died_at)
    shown = f"{timezone.localtime(died_at):%Y-%m-%d %H:%M:%S}"
    for model in ("deadjob", "lock", "schedule", "job"):
        html = admin_client.get(reverse(f"admin:alkstore_django_{model}_changelist"))
        assert shown in html.content.decode(), model


def test_job_changelist__shows_worker_deadline_and_marks_overdue_claims(admin_client):
    queue = store.queue("live.q")
    queue.enqueue({"a": 1})
    queue.enqueue({"a": 2})
    late = queue.claim_one("worker-late")
    fresh = queue.claim_one("worker-fresh")
    lapse_claim(late.job.id)
    url = reverse("admin:alkstore_django_job_changelist")
    response = admin_client.get(url)
    assert response.status_code == 200
    html = response.content.decode()
    assert "worker-late" in html and "worker-fresh" in html
    assert html.count('class="alk-overdue"') == 1
    overdue = admin_client.get(url, {"overdue": "yes"}).context["cl"].result_list
    assert [j.id for j in overdue] == [late.job.id]
    by_state = admin_client.get(url, {"state__exact": "processing"}).context["cl"].result_list
    assert sorted(j.id for j in by_state) == sorted([late.job.id, fresh.job.id])


def test_job_admin__has_no_add_or_change_form(admin_client):
    job_id = store.queue("live.q").enqueue({"x": "<b>bold</b>"})
    assert admin_client.get(reverse("admin:alkstore_django_job_add")).status_code == 403
    response = admin_client.get(reverse("admin:alkstore_django_job_change", args=[job_id]))
    assert response.status_code == 200
    html = response.content.decode()
    assert 'name="_save"' not in html
    assert "&lt;b&gt;bold&lt;/b&gt;" in html


def test_cancel_action__deletes_selected_live_jobs(admin_client):
    queue = store.queue("live.q")
    doomed = queue.enqueue_many([1, 2])
    kept = queue.enqueue(3)
    post_action(admin_client, reverse("admin:alkstore_django_job_changelist"), "cancel", doomed)
    assert list(Job.objects.values_list("id", flat=True)) == [kept]
    entries = LogEntry.objects.filter(content_type__model="job").order_by("object_id")
    assert [(e.object_id, e.action_flag, e.change_message) for e in entries] == [
        (str(i), DELETION, "Cancelled.") for i in sorted(doomed)
    ]


def test_cancel_action__needs_delete_permission(staff_client):
    client = staff_client("view_job")
    job_id = store.queue("live.q").enqueue(1)
    url = reverse("admin:alkstore_django_job_changelist")
    post_action(client, url, "cancel", [job_id])
    assert Job.objects.filter(id=job_id).exists()


def test_schedule_changelist__shows_spec_queue_next_run_and_toggles(admin_client):
    paused = ScheduleFactory(
        name="nightly", enabled=False, next_run_at=timezone.now() - timedelta(days=2)
    )
    running = ScheduleFactory(name="minutely")
    url = reverse("admin:alkstore_django_schedule_changelist")
    response = admin_client.get(url)
    assert response.status_code == 200
    html = response.content.decode()
    assert "nightly" in html and "@every 1m" in html and "sched.q" in html
    post_action(admin_client, url, "enable", [paused.id])
    paused.refresh_from_db()
    assert paused.enabled
    # Resuming skips the fires missed while paused: the next run is in the future.
    assert paused.next_run_at > timezone.now() - timedelta(seconds=5)
    assert paused.next_run_at.timestamp() % 60 == 0
    post_action(admin_client, url, "disable", [running.id])
    assert not Schedule.objects.get(id=running.id).enabled
    assert (
        admin_client.get(
            reverse("admin:alkstore_django_schedule_change", args=[running.id])
        ).status_code
        == 200
    )


def test_schedule_toggle__needs_change_permission(staff_client):
    client = staff_client("view_schedule")
    schedule = ScheduleFactory()
    post_action(
        client, reverse("admin:alkstore_django_schedule_changelist"), "disable", [schedule.id]
    )
    assert Schedule.objects.get(id=schedule.id).enabled


def test_lock_changelist__marks_expired_leases(admin_client):
    LockFactory(name="held-lock", owner="me", fence=7)
    LockFactory(name="stale-lock", expires_at=timezone.now() - timedelta(seconds=5))
    response = admin_client.get(reverse("admin:alkstore_django_lock_changelist"))
    assert response.status_code == 200
    html = response.content.decode()
    assert "held-lock" in html and "stale-lock" in html
    assert html.count('class="alk-expired"') == 1


def waiting_for_retry(queue: str = "live.q") -> int:
    q = store.queue(queue)
    q.enqueue({})
    handle = q.claim_one("w")
    assert handle.retry("boom", delay_s=3600)
    return handle.job.id


def test_retry_now_action__makes_the_selected_waiting_jobs_due(admin_client):
    waiting = waiting_for_retry()
    kept = waiting_for_retry()
    fresh = store.queue("live.q").enqueue({})
    url = reverse("admin:alkstore_django_job_changelist")
    response = post_action(admin_client, url, "retry_now", [waiting, fresh])
    messages = [str(m) for m in response.wsgi_request._messages]
    assert messages == ["Made 1 job(s) due now. 1 were not waiting for a retry "
                        "(running, due, or never attempted)."]  # fmt: skip
    claimed = {h.job.id for h in store.queue("live.q").claim_batch("w", 5)}
    assert claimed == {waiting, fresh}
    assert Job.objects.get(id=kept).state == "pending"
    entries = LogEntry.objects.filter(content_type__model="job")
    assert [(e.object_id, e.action_flag, e.change_message) for e in entries] == [
        (str(waiting), CHANGE, "Made due now.")
    ]


def test_retry_now_action__needs_change_permission(staff_client):
    waiting = waiting_for_retry()
    url = reverse("admin:alkstore_django_job_changelist")
    post_action(staff_client("view_job", "delete_job"), url, "retry_now", [waiting])
    assert store.queue("live.q").claim_one("w") is None
    assert not LogEntry.objects.exists()


def test_job_detail__shows_its_unique_key(admin_client):
    job_id = store.queue("live.q").enqueue({}, unique_key="order:<42>")
    response = admin_client.get(reverse("admin:alkstore_django_job_change", args=[job_id]))
    assert "order:&lt;42&gt;" in response.content.decode()
