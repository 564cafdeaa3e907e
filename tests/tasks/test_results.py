"""AlkstoreBackend end to end, in-process: enqueue → run → result, on both engines."""

from __future__ import annotations

from datetime import timedelta

import pytest

pytest.importorskip("django.tasks", reason="Django's Tasks framework needs Django 6.0+")

from asgiref.sync import async_to_sync
from django.db import transaction
from django.tasks import TaskResultStatus, task_backends
from django.tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
from django.tasks.signals import task_enqueued, task_finished, task_started

from alkstore_django import store
from alkstore_django.models import DeadJob, Job
from alkstore_django.models import TaskResult as TaskResultRow
from alkstore_django.tasks import AlkstoreBackend, TaskLost, prune_results
from alkstore_django.testing import run_ready_tasks
from tests.helpers import db_now, lapse_claim, make_due
from tests.testapp import tasks
from tests.testapp.models import Run

pytestmark = pytest.mark.django_db


def test_enqueue__returns_a_ready_result_equal_to_get_result():
    result = tasks.add.enqueue(1, 2)

    assert result.status == TaskResultStatus.READY
    assert (result.args, result.kwargs, result.backend) == ([1, 2], {}, "default")
    assert result.enqueued_at is not None and result.worker_ids == [] and result.errors == []
    assert tasks.add.get_result(result.id) == result
    job = Job.objects.get(id=int(result.id))
    assert job.queue == "default" and job.max_attempts == 1
    assert job.payload == {
        "task": "tests.testapp.tasks.add",
        "args": [1, 2],
        "kwargs": {},
        "backend": "default",
        "run_after": None,
    }


def test_run__successful_with_the_return_value():
    result = tasks.add.enqueue(2, b=3)

    assert run_ready_tasks() == 1

    done = tasks.add.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.return_value == 5
    assert done.worker_ids == ["run_ready_tasks"] and done.attempts == 1
    assert done.enqueued_at == result.enqueued_at
    assert done.enqueued_at <= done.started_at == done.last_attempted_at <= done.finished_at
    assert not Job.objects.filter(id=int(result.id)).exists()
    result.refresh()
    assert result == done


def test_run__normalises_the_return_value_to_json():
    result = tasks.echo.enqueue((1, 2), key=("a",))
    run_ready_tasks()
    assert tasks.echo.get_result(result.id).return_value == {
        "args": [[1, 2]],
        "kwargs": {"key": ["a"]},
    }


def test_raising_task__failed_with_class_path_and_traceback():
    result = tasks.fail_value_error.enqueue("it broke")

    run_ready_tasks()

    failed = tasks.fail_value_error.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED and failed.is_finished
    [error] = failed.errors
    assert error.exception_class_path == "builtins.ValueError"
    assert error.exception_class is ValueError
    assert error.traceback.startswith("Traceback (most recent call last):")
    assert error.traceback.endswith("ValueError: it broke\n")
    assert "fail_value_error" in error.traceback
    with pytest.raises(ValueError, match="Task failed"):
        _ = failed.return_value
    # Retries are off by default: one attempt, then the dead letters.
    assert DeadJob.objects.get(id=int(result.id)).attempts == 1


def test_system_exit__is_a_failure():
    result = tasks.system_exit.enqueue()
    run_ready_tasks()
    failed = tasks.system_exit.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED
    assert failed.errors[0].exception_class is SystemExit


def test_non_json_return_value__is_a_failure():
    result = tasks.not_json.enqueue()
    run_ready_tasks()
    failed = tasks.not_json.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED
    assert failed.errors[0].exception_class is TypeError
    assert "Unsupported type" in failed.errors[0].traceback


def test_async_task_function__runs():
    result = tasks.async_add.enqueue(4, 5)
    run_ready_tasks()
    assert tasks.async_add.get_result(result.id).return_value == 9


def test_takes_context__sees_the_attempt_numbers_with_retries_on():
    result = tasks.flaky.enqueue(succeed_at=3)
    assert result.backend == "retry"
    for attempt in (1, 2):
        run_ready_tasks()
        waiting = tasks.flaky.get_result(result.id)
        assert waiting.status == TaskResultStatus.READY
        assert len(waiting.errors) == attempt and waiting.attempts == attempt
        make_due(int(result.id))  # skip the backoff

    run_ready_tasks()

    done = tasks.flaky.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.return_value == 3
    assert done.attempts == 3
    assert [e.traceback.splitlines()[-1] for e in done.errors] == [
        "RuntimeError: attempt 1 failed",
        "RuntimeError: attempt 2 failed",
    ]


def test_takes_context__gets_a_running_result():
    result = tasks.context_view.enqueue()
    run_ready_tasks()
    seen = tasks.context_view.get_result(result.id).return_value
    assert seen == {
        "attempt": 1,
        "id": result.id,
        "status": "RUNNING",
        "worker_ids": ["run_ready_tasks"],
    }


@pytest.mark.parametrize("flaky", tasks.PER_TASK_ATTEMPTS, ids=lambda t: t.name)
def test_per_task_max_attempts__turns_retries_on_for_that_task(flaky):
    result = flaky.enqueue()
    assert Job.objects.get(id=int(result.id)).max_attempts == 2
    run_ready_tasks()
    make_due(int(result.id))
    run_ready_tasks()
    done = flaky.get_result(result.id)
    assert (done.status, done.return_value, len(done.errors)) == ("SUCCESSFUL", 2, 1)


def test_signals__sent_once_each_with_the_backend_class_as_sender():
    seen = []

    def receiver(signal, sender, task_result, **kwargs):
        seen.append((signal, sender, task_result.id, task_result.status))

    for signal in (task_enqueued, task_started, task_finished):
        signal.connect(receiver)
    try:
        ok = tasks.add.enqueue(1, 1)
        bad = tasks.fail_value_error.enqueue()
        run_ready_tasks()
    finally:
        for signal in (task_enqueued, task_started, task_finished):
            signal.disconnect(receiver)

    for result, final in ((ok, "SUCCESSFUL"), (bad, "FAILED")):
        mine = [(s, sender, status) for s, sender, i, status in seen if i == result.id]
        assert mine == [
            (task_enqueued, AlkstoreBackend, "READY"),
            (task_started, AlkstoreBackend, "RUNNING"),
            (task_finished, AlkstoreBackend, final),
        ]


def test_task_finished__sent_once_after_retries():
    finished = []

    def receiver(sender, task_result, **kwargs):
        finished.append(task_result.status)

    task_finished.connect(receiver)
    try:
        result = tasks.flaky.enqueue(succeed_at=2)
        run_ready_tasks()
        make_due(int(result.id))
        run_ready_tasks()
    finally:
        task_finished.disconnect(receiver)
    assert finished == ["SUCCESSFUL"]


@pytest.mark.parametrize(
    "bad_id", ["999999999", "abc", "", "-1", "1.5", " 1", "٣", str(2**64), None, 1.0]
)
def test_get_result__unknown_or_malformed_ids_do_not_exist(bad_id):
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result(bad_id)


def test_get_result__a_plain_job_or_another_backends_result_does_not_exist():
    plain = store.queue("default").enqueue({"not": "a task"})
    other = tasks.flaky.enqueue(succeed_at=1)
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result(str(plain))
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result(other.id)
    assert task_backends["retry"].get_result(other.id) == other


def test_get_result__another_task_mismatches():
    result = tasks.add.enqueue(1, 2)
    with pytest.raises(TaskResultMismatch):
        tasks.echo.get_result(result.id)


def test_aenqueue_and_aget_result():
    async def scenario():
        result = await tasks.add.aenqueue(3, 4)
        return result, await tasks.add.aget_result(result.id)

    result, fetched = async_to_sync(scenario)()
    assert result == fetched and result.status == TaskResultStatus.READY


def test_priority_and_run_after_map_onto_the_job():
    later = db_now() + timedelta(hours=1)
    result = tasks.add.using(priority=7, run_after=later).enqueue(1, 1)
    job = Job.objects.get(id=int(result.id))
    assert (job.priority, job.run_at) == (7, later)

    assert run_ready_tasks() == 0  # deferred: not ready yet
    assert tasks.add.get_result(result.id) == result
    assert tasks.add.get_result(result.id).task.run_after == later


def test_priority__higher_runs_first():
    for label, priority in (("low", -5), ("high", 50), ("mid", 0)):
        tasks.record.using(priority=priority).enqueue(label)
    run_ready_tasks()
    assert list(Run.objects.order_by("id").values_list("queue", flat=True)) == [
        "high",
        "mid",
        "low",
    ]


def test_enqueue__joins_the_callers_transaction():
    with pytest.raises(RuntimeError), transaction.atomic():
        result = tasks.add.enqueue(1, 1)
        raise RuntimeError("roll back")
    with pytest.raises(TaskResultDoesNotExist):
        tasks.add.get_result(result.id)


def test_enqueue__non_json_arguments_write_nothing():
    before = Job.objects.count()
    with pytest.raises(TypeError, match="Unsupported type"):
        tasks.add.enqueue(object(), 1)
    assert Job.objects.count() == before


def test_status__running_while_claimed():
    result = tasks.add.enqueue(1, 1)
    handle = store.queue("default").claim_one("w-1")
    assert handle is not None
    assert tasks.add.get_result(result.id).status == TaskResultStatus.RUNNING


def test_dead_letter_without_result_row__failed_with_a_clear_error():
    """A worker that died after its last allowed claim: never RUNNING forever."""
    result = tasks.add.enqueue(1, 1)
    store.queue("default").claim_one("gone-worker")
    lapse_claim(int(result.id))

    lapsed = tasks.add.get_result(result.id)
    assert lapsed.status == TaskResultStatus.FAILED

    store.queue("default").claim_one("other-worker")  # the pre-claim sweep buries it

    failed = tasks.add.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED and failed.finished_at is not None
    [error] = failed.errors
    assert error.exception_class is TaskLost
    assert "gone-worker" not in error.traceback  # no start was recorded for that claim
    assert "max attempts exceeded" in error.traceback


def test_non_task_payload_on_a_task_queue__dead_lettered_at_once():
    job_id = store.queue("default", max_attempts=5).enqueue({"not": "a task"})
    run_ready_tasks()
    dead = DeadJob.objects.get(id=job_id)
    assert dead.attempts == 1 and "not a Django Tasks job" in dead.last_error


def test_retention__prunes_old_finished_results_only():
    old = tasks.add.enqueue(1, 1)
    new = tasks.add.enqueue(2, 2)
    waiting = tasks.flaky.enqueue(succeed_at=1)
    run_ready_tasks(queues=["default"])
    TaskResultRow.objects.filter(id=int(old.id)).update(finished_at=db_now() - timedelta(days=8))

    assert prune_results(task_backends["default"]) == 1

    with pytest.raises(TaskResultDoesNotExist):
        tasks.add.get_result(old.id)
    assert tasks.add.get_result(new.id).status == TaskResultStatus.SUCCESSFUL
    assert tasks.flaky.get_result(waiting.id).status == TaskResultStatus.READY


def test_capabilities():
    backend = task_backends["default"]
    assert backend.supports_defer and backend.supports_priority
    assert backend.supports_get_result and backend.supports_async_task
