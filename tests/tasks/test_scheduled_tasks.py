"""A Django ``@task`` run on a schedule: ``schedule_task`` and the fired boundary."""

from __future__ import annotations

from datetime import timedelta

import pytest

pytest.importorskip("django.tasks", reason="Django's Tasks framework needs Django 6.0+")

from django.tasks import TaskResultStatus
from django.tasks.exceptions import InvalidTask

from alkstore_django import store
from alkstore_django.models import Job, Schedule
from alkstore_django.scheduler import tick
from alkstore_django.tasks import schedule_task
from alkstore_django.testing import run_ready_tasks
from tests.helpers import boundaries_ago
from tests.testapp import tasks

pytestmark = pytest.mark.django_db


def test_schedule_task__each_fire_is_a_tasks_job_with_a_result():
    record = schedule_task(
        "adder", tasks.add, "@cron */5 * * * *", args=[2], kwargs={"b": 3}, misfire="latest"
    )

    assert (record.queue, record.max_attempts, record.misfire) == ("default", 1, "latest")
    assert record.payload == {"task": "tests.testapp.tasks.add", "args": [2], "kwargs": {"b": 3},
                              "backend": "default", "run_after": None}  # fmt: skip
    Schedule.objects.filter(name="adder").update(next_run_at=record.next_run_at.replace(year=2025))
    assert tick(store) == 1  # a year missed, one fire: the latest boundary
    job = Job.objects.get(queue="default")

    assert run_ready_tasks() == 1

    result = tasks.add.get_result(str(job.id))
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5


def test_schedule_task__a_context_task_reads_the_boundary_it_runs_for():
    schedule_task("tagged", tasks.scheduled_boundary, "@every 10s", args=["nightly"])
    first = boundaries_ago("tagged", 2)
    assert tick(store) == 2
    ids = sorted(Job.objects.filter(queue="default").values_list("id", flat=True))

    assert run_ready_tasks() == 2

    values = [tasks.scheduled_boundary.get_result(str(i)).return_value for i in ids]
    expected = [first, first + timedelta(seconds=10)]
    assert [v["boundary"] for v in values] == [b.isoformat() for b in expected]
    assert {(v["label"], v["schedule"]) for v in values} == {("nightly", "tagged")}


def test_schedule_task__refuses_a_task_time_limit_the_queue_would_not_stamp():
    with pytest.raises(InvalidTask, match="timeout_s 5 but queue 'default' stamps None"):
        schedule_task("limited", tasks.limited, "@cron @daily")
    assert not Schedule.objects.exists()
