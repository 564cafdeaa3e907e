"""A requeued failed task: its result reads READY everywhere and keeps its earlier errors."""

from __future__ import annotations

import pytest

pytest.importorskip("django.tasks", reason="Django's Tasks framework needs Django 6.0+")

from django.tasks import TaskResultStatus
from django.urls import reverse

from alkstore_django import operations
from alkstore_django.models import TaskResult as TaskResultRow
from alkstore_django.testing import run_ready_tasks
from tests.testapp import tasks

pytestmark = pytest.mark.django_db


def test_requeued_failed_task__admin_and_get_result_agree_and_the_first_error_stays(
    admin_client,
):
    result = tasks.fail_value_error.enqueue("first run")
    assert run_ready_tasks() == 1
    assert tasks.fail_value_error.get_result(result.id).status == TaskResultStatus.FAILED

    assert operations.requeue_dead([int(result.id)]) == 1
    ready = tasks.fail_value_error.get_result(result.id)
    row = TaskResultRow.objects.get(id=int(result.id))
    assert ready.status == TaskResultStatus.READY
    assert row.status == "READY" and row.finished_at is None  # before the fix: FAILED
    assert [e.traceback.splitlines()[-1] for e in ready.errors] == ["ValueError: first run"]
    listing = admin_client.get(reverse("admin:alkstore_django_taskresult_changelist"))
    assert '<td class="field-status">ready</td>' in listing.content.decode()

    assert run_ready_tasks() == 1  # fails again: both runs' errors are kept, in order
    failed = tasks.fail_value_error.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED
    assert len(failed.errors) == 2  # before the fix: the first run's error was gone
    assert all(e.traceback.endswith("ValueError: first run\n") for e in failed.errors)
    assert [e["attempt"] for e in TaskResultRow.objects.get(id=int(result.id)).errors] == [0, 1]
    detail = admin_client.get(
        reverse("admin:alkstore_django_taskresult_change", args=[int(result.id)])
    ).content.decode()
    assert "before the requeue" in detail and "attempt 1:" in detail
