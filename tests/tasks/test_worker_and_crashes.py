"""Tasks under the real worker: threads, ``runworker`` subprocesses, SIGKILL mid-task."""

from __future__ import annotations

import os
import signal
import threading

import pytest

pytest.importorskip("django.tasks", reason="Django's Tasks framework needs Django 6.0+")

from django.tasks import TaskResultStatus
from django.tasks.signals import task_finished

from alkstore_django.models import DeadJob
from alkstore_django.tasks import TaskLost
from alkstore_django.testing import run_ready_tasks
from alkstore_django.worker import Worker
from tests.helpers import lapse_claim, make_due, runworker, wait_for
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def test_worker__runs_tasks_and_writes_results_in_the_outcome_transaction():
    finished = []

    def receiver(sender, task_result, **kwargs):
        finished.append((task_result.id, task_result.status))

    ok = tasks.add.enqueue(20, 22)
    bad = tasks.fail_value_error.enqueue("in a worker")
    ctx = tasks.context_view.enqueue()
    task_finished.connect(receiver)
    try:
        stats = Worker(["default"], burst=True, concurrency=2).run(threading.Event())
    finally:
        task_finished.disconnect(receiver)

    assert (stats.acked, stats.dead) == (2, 1)
    done = tasks.add.get_result(ok.id)
    assert (done.status, done.return_value) == (TaskResultStatus.SUCCESSFUL, 42)
    assert done.worker_ids[0] != "run_ready_tasks"
    failed = tasks.fail_value_error.get_result(bad.id)
    assert failed.status == TaskResultStatus.FAILED
    assert failed.errors[0].traceback.endswith("ValueError: in a worker\n")
    assert tasks.context_view.get_result(ctx.id).return_value["attempt"] == 1
    assert sorted(finished) == sorted(
        [(ok.id, "SUCCESSFUL"), (bad.id, "FAILED"), (ctx.id, "SUCCESSFUL")]
    )


def start_worker_and_kill_mid_task(subprocess_env, result, queue, marker, *, whole_group=True):
    """SIGKILL the worker mid-task: with its sentinel (which settles) or the whole group."""
    proc = runworker(
        subprocess_env, "--queue", queue, "--concurrency", "1", wait=False, new_session=True
    )
    try:
        assert wait_for(marker.exists, timeout=30.0), "the worker never started the task"
        # write_text creates the file before it writes: wait for the id, not the name.
        assert wait_for(lambda: marker.read_text(), timeout=5) == result.id
    finally:
        if whole_group:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)  # returns once the sentinel, too, has finished
    assert proc.returncode == -signal.SIGKILL


def test_sigkill_mid_task__the_sentinel_records_the_lost_attempt_at_once(subprocess_env, tmp_path):
    marker = tmp_path / "started"
    task = tasks.hang_first_attempt.using(backend="retry", queue_name="tasks-retry")
    result = task.enqueue(str(marker))

    start_worker_and_kill_mid_task(subprocess_env, result, "tasks-retry", marker, whole_group=False)
    waiting = task.get_result(result.id)
    assert waiting.status == TaskResultStatus.READY and waiting.attempts == 1
    [lost] = waiting.errors
    assert lost.exception_class is TaskLost and "died while running this job" in lost.traceback

    make_due(int(result.id))  # the retry's backoff passes
    assert run_ready_tasks(backend="retry") == 1
    done = task.get_result(result.id)
    assert (done.status, done.return_value) == (TaskResultStatus.SUCCESSFUL, {"recovered_on": 2})
    assert len(done.errors) == 1


def test_sigkill_mid_task__retries_off__the_sentinel_fails_it_at_once(subprocess_env, tmp_path):
    marker = tmp_path / "started"
    task = tasks.hang_first_attempt.using(queue_name="tasks-kill")
    result = task.enqueue(str(marker))

    start_worker_and_kill_mid_task(subprocess_env, result, "tasks-kill", marker, whole_group=False)
    failed = task.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED and failed.finished_at is not None
    assert "died while running this job" in DeadJob.objects.get(id=int(result.id)).last_error
    [error] = failed.errors
    assert error.exception_class is TaskLost


def test_sigkill_of_the_whole_group_mid_task__retries_on__rerun_and_successful(
    subprocess_env, tmp_path
):
    marker = tmp_path / "started"
    task = tasks.hang_first_attempt.using(backend="retry", queue_name="tasks-retry")
    result = task.enqueue(str(marker))

    start_worker_and_kill_mid_task(subprocess_env, result, "tasks-retry", marker)
    running = task.get_result(result.id)
    assert running.status == TaskResultStatus.RUNNING and running.attempts == 1
    killed_worker = running.worker_ids[0]

    lapse_claim(int(result.id))  # the visibility timeout passes
    assert run_ready_tasks(backend="retry") == 1

    done = task.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.return_value == {"recovered_on": 2}
    assert done.worker_ids == [killed_worker, "run_ready_tasks"]
    [lost] = done.errors
    assert lost.exception_class is TaskLost
    assert killed_worker in lost.traceback and "claim lapsed" in lost.traceback


def test_sigkill_of_the_whole_group_mid_task__retries_off__failed_with_a_clear_error(
    subprocess_env, tmp_path
):
    marker = tmp_path / "started"
    task = tasks.hang_first_attempt.using(queue_name="tasks-kill")
    result = task.enqueue(str(marker))

    start_worker_and_kill_mid_task(subprocess_env, result, "tasks-kill", marker)
    assert task.get_result(result.id).status == TaskResultStatus.RUNNING

    lapse_claim(int(result.id))
    # Already FAILED before any worker sweeps it: the job can never run again.
    assert task.get_result(result.id).status == TaskResultStatus.FAILED
    assert run_ready_tasks(queues=["tasks-kill"]) == 0  # the pre-claim sweep buries it

    assert DeadJob.objects.get(id=int(result.id)).last_error == "max attempts exceeded"
    failed = task.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED and failed.finished_at is not None
    [error] = failed.errors
    assert error.exception_class is TaskLost
    assert "max attempts exceeded" in error.traceback
    assert failed.worker_ids[0] in error.traceback
