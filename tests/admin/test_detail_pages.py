"""The admin's read-only detail pages show times to the second, as the lists do."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from alkstore_django import store
from alkstore_django.models import Job
from tests.factories import DeadJobFactory, LockFactory, ScheduleFactory

pytestmark = pytest.mark.django_db


def test_detail_pages__show_times_to_the_second(admin_client, staff_client):
    at = timezone.now().replace(microsecond=0) - timedelta(seconds=13)
    shown = f"{timezone.localtime(at):%Y-%m-%d %H:%M:%S}"
    dead = DeadJobFactory(died_at=at)
    lock = LockFactory(name="a-lock", acquired_at=at)
    job_id = store.queue("detail.q").enqueue(1, run_at=at)
    assert Job.objects.filter(id=job_id).exists()
    pages = [("deadjob", dead.pk), ("lock", lock.pk), ("job", job_id)]
    for model, pk in pages:
        html = admin_client.get(reverse(f"admin:alkstore_django_{model}_change", args=[pk]))
        assert html.status_code == 200, model
        assert shown in html.content.decode(), model  # before the fix: to the minute only
    # A schedule is read-only for who may only view it.
    schedule = ScheduleFactory(name="a-schedule", last_fired_at=at)
    viewer = staff_client("view_schedule")
    html = viewer.get(reverse("admin:alkstore_django_schedule_change", args=[schedule.pk]))
    assert html.status_code == 200
    assert 'class="form-row field-last_fired_at"' in html.content.decode()
    assert shown in html.content.decode()


def test_schedule_edit_form__shows_its_read_only_times_to_the_second(staff_client):
    at = timezone.now().replace(microsecond=0) - timedelta(seconds=13)
    shown = f"{timezone.localtime(at):%Y-%m-%d %H:%M:%S}"
    schedule = ScheduleFactory(name="edited", last_fired_at=at, last_error_at=at)
    editor = staff_client("view_schedule", "change_schedule")
    html = editor.get(reverse("admin:alkstore_django_schedule_change", args=[schedule.pk]))
    assert html.status_code == 200
    page = html.content.decode()
    assert 'name="spec"' in page  # the editable form
    assert page.count(shown) >= 2, page  # last fired, last error: before the fix to the minute
