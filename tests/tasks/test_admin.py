"""Task results in the admin, next to the job they came from."""

from __future__ import annotations

import pytest

pytest.importorskip("django.tasks", reason="Django's Tasks framework needs Django 6.0+")

from django.urls import reverse

from alkstore_django.testing import run_ready_tasks
from tests.testapp import tasks

pytestmark = pytest.mark.django_db


def test_task_results__listed_and_shown_read_only_with_the_job_link(admin_client):
    ok = tasks.add.enqueue(1, 2)
    bad = tasks.fail_value_error.enqueue("shown in the admin")
    run_ready_tasks()

    listing = admin_client.get(reverse("admin:alkstore_django_taskresult_changelist"))
    assert listing.status_code == 200
    assert b"tests.testapp.tasks.add" in listing.content

    detail = admin_client.get(
        reverse("admin:alkstore_django_taskresult_change", args=[int(bad.id)])
    )
    assert detail.status_code == 200
    assert b"ValueError: shown in the admin" in detail.content
    dead_url = reverse("admin:alkstore_django_deadjob_change", args=[int(bad.id)])
    assert dead_url.encode() in detail.content

    done = admin_client.get(reverse("admin:alkstore_django_taskresult_change", args=[int(ok.id)]))
    assert b"gone (acked" in done.content
    assert b"Save" not in done.content


def test_task_results__searchable_by_id(admin_client):
    result = tasks.add.enqueue(1, 2)
    run_ready_tasks()
    url = reverse("admin:alkstore_django_taskresult_changelist")
    response = admin_client.get(url, {"q": result.id})
    assert response.status_code == 200
    assert response.context["cl"].result_count == 1
