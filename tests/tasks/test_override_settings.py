"""Backends configured after start-up (``override_settings(TASKS=...)``) run like the others."""

from __future__ import annotations

import pytest

pytest.importorskip("django.tasks", reason="Django's Tasks framework needs Django 6.0+")

from django.tasks import TaskResultStatus
from django.test import override_settings

from alkstore_django.testing import run_ready_tasks
from tests.testapp import tasks

pytestmark = pytest.mark.django_db

LATE_QUEUE = "tasks-configured-late"


def test_run_ready_tasks__runs_a_queue_of_a_backend_configured_by_override_settings():
    late = {"default": {"BACKEND": "alkstore_django.tasks.AlkstoreBackend", "QUEUES": [LATE_QUEUE]}}
    with override_settings(TASKS=late):
        result = tasks.add.using(queue_name=LATE_QUEUE).enqueue(2, 3)

        assert run_ready_tasks() == 1

        done = tasks.add.get_result(result.id)
        assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value == 5
