"""Unique Django Tasks: ``@task(unique=True)`` keeps one live job per task and arguments."""

from __future__ import annotations

import pytest

pytest.importorskip("django.tasks", reason="Django's Tasks framework needs Django 6.0+")

from django.tasks import TaskResultStatus
from django.tasks.exceptions import InvalidTask
from django.tasks.signals import task_enqueued

from alkstore_django.models import Job
from alkstore_django.tasks import task, unique_task_key
from alkstore_django.testing import run_ready_tasks
from tests.testapp import tasks

pytestmark = pytest.mark.django_db


def test_a_unique_task_with_the_same_arguments__returns_the_live_jobs_result():
    sent = []

    def count(sender, **kwargs):
        sent.append(kwargs["task_result"].id)

    task_enqueued.connect(count)
    try:
        first = tasks.unique_add.enqueue(1, 2)
        again = tasks.unique_add.enqueue(1, 2)
        other = tasks.unique_add.enqueue(2, 1)
    finally:
        task_enqueued.disconnect(count)
    assert again.id == first.id and again.status == TaskResultStatus.READY
    assert other.id != first.id
    assert sent == [first.id, other.id]
    assert Job.objects.get(id=int(first.id)).unique_key == unique_task_key(
        "tests.testapp.tasks.unique_add", [1, 2], {}
    )
    run_ready_tasks()
    assert tasks.unique_add.enqueue(1, 2).id not in (first.id, other.id)


def test_unique_for_s__a_finished_tasks_result_is_returned_within_the_window():
    first = tasks.unique_for_an_hour.enqueue(7)
    run_ready_tasks()
    again = tasks.unique_for_an_hour.enqueue(7)
    assert again.id == first.id
    assert again.status == TaskResultStatus.SUCCESSFUL and again.return_value == 7
    assert not Job.objects.exists()


def test_unique_task_key__ignores_keyword_order_and_fits_a_key():
    key = unique_task_key("a.b", [1], {"x": 1, "y": 2})
    assert key == unique_task_key("a.b", [1], {"y": 2, "x": 1})
    assert key != unique_task_key("a.b", [2], {"x": 1, "y": 2})
    assert len(unique_task_key("m" * 500, [], {})) <= 200


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"unique_for_s": 10}, "sets unique_for_s without unique=True"),
        ({"unique": True, "unique_for_s": 0}, "Invalid unique_for_s 0"),
        ({"unique": "yes"}, "Invalid unique 'yes'"),
    ],
)
def test_validate_task__refuses_bad_unique_options(options, message):
    with pytest.raises(InvalidTask, match=message):
        task(**options)(tasks.add.func)
