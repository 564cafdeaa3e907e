"""Handlers that break the way real ones do, under a real ``runworker``: issue 12's cases.

Each test runs a hostile job beside innocent ones in one ``runworker --burst``
subprocess and checks the promise: the worker keeps claiming, every innocent
job is acked exactly once at its first attempt, no attempt is spent on a job
that never started, and the stored error is bounded and readable.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest
from django.db import transaction
from django.db.models import F

from alkstore_django import operations, store
from alkstore_django.error_text import MAX_ERROR_CHARS
from alkstore_django.models import DeadJob, Job
from tests.helpers import (
    assert_acked_once,
    lapse_claim,
    make_due,
    needs_django_tasks,
    runworker,
    wait_for,
)
from tests.testapp.models import Run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def with_innocents(env, queue, payload=None, **opts):
    """Enqueue innocents around one hostile job, run one burst worker; return (job id, output)."""
    innocent = store.queue("t.record")
    before = innocent.enqueue_many(["before"] * 3)
    job_id = store.queue(queue, **opts).enqueue(payload)
    after = innocent.enqueue_many(["after"] * 3)
    code, out = runworker(env, "--queue", queue, "--queue", "t.record", "--burst")
    assert code == 0, out[-3000:]
    assert_acked_once(before + after)
    return job_id, out


def assert_readable(error):
    assert error and len(error) <= MAX_ERROR_CHARS
    assert "\x00" not in error
    error.encode("utf-8")  # no lone surrogate


# --- 1-4: error text the database would refuse, or could not even print -----------------


def test_1_nul_in_the_error__is_stored_escaped_and_the_worker_carries_on(subprocess_env):
    job_id, out = with_innocents(subprocess_env, "h.nul", max_attempts=1)
    dead = DeadJob.objects.get(id=job_id)
    assert dead.last_error == "ValueError: bad \\x00 byte"
    assert "database unavailable" not in out


def test_2_lone_surrogate_in_the_error__is_stored_escaped_and_nothing_crashes(subprocess_env):
    job_id, out = with_innocents(subprocess_env, "h.surrogate", max_attempts=1)
    dead = DeadJob.objects.get(id=job_id)
    assert dead.last_error == "ValueError: cannot open \\udc80.txt"
    assert_readable(dead.last_error)
    assert "UnicodeEncodeError" not in out


def test_3_exception_whose_str_raises__is_a_failed_attempt_not_a_dead_thread(subprocess_env):
    job_id, _ = with_innocents(subprocess_env, "h.unprintable", max_attempts=1)
    dead = DeadJob.objects.get(id=job_id)
    assert dead.last_error == "UnprintableError: <str() raised RuntimeError>"
    assert Run.objects.filter(job_id=job_id).count() == 1


def test_4_a_five_megabyte_message__is_capped_in_storage_and_in_the_log(subprocess_env):
    job_id, out = with_innocents(subprocess_env, "h.huge", max_attempts=1)
    dead = DeadJob.objects.get(id=job_id)
    assert_readable(dead.last_error)
    assert dead.last_error.startswith("ValueError: xxx")
    assert "characters cut" in dead.last_error
    assert len(out) < 200_000  # not 5 MB four times over


# --- 5-6: crashes and shutdowns spend only the attempt of the job that was running -------


def test_5_a_job_that_kills_its_worker__does_not_charge_its_prefetched_neighbours(
    subprocess_env,
):
    q = store.queue("h.mixed", retry_base_s=0)
    killer = q.enqueue({"exit": True}, priority=1)
    neighbours = q.enqueue_many([{}] * 3)
    args = ["--queue", "h.mixed", "--burst", "--concurrency", "1", "--batch", "4"]
    code, out = runworker(subprocess_env, *args)
    assert code == 3, out
    for job_id in neighbours:
        job = store.get_job(job_id)
        assert (job.state, job.attempts) == ("pending", 0), out  # never started: not charged
    job = store.get_job(killer)
    assert (job.state, job.attempts) == ("pending", 1)
    assert_readable(job.last_error)
    assert "died while running this job" in job.last_error
    # Then the killer is dead-lettered after max_attempts runs, and the neighbours acked.
    for _ in range(2):
        code, out = runworker(subprocess_env, *args)
        assert code == 3, out
    assert DeadJob.objects.get(id=killer).attempts == 3
    code, out = runworker(subprocess_env, *args)
    assert code == 0, out
    assert_acked_once(neighbours)
    assert Run.objects.filter(job_id=killer).count() == 3


def test_6_sigterm__a_job_outliving_the_grace_period_is_never_rerun_at_the_same_attempt(
    subprocess_env,
):
    job_id = store.queue("h.outlive", retry_base_s=0).enqueue({"sleep_s": 5})
    proc = runworker(subprocess_env, "--queue", "h.outlive", "--grace-s", "0.5", wait=False)
    assert wait_for(lambda: Run.objects.filter(job_id=job_id).exists())
    proc.send_signal(signal.SIGTERM)
    started = time.monotonic()
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert time.monotonic() - started < 4  # the grace period, not the handler's 5 s
    job = store.get_job(job_id)
    assert (job.state, job.attempts) == ("pending", 1)
    assert job.last_error.startswith("interrupted: the worker shut down")
    Job.objects.filter(id=job_id).update(payload={"sleep_s": 0})
    make_due(job_id)
    code, out = runworker(subprocess_env, "--queue", "h.outlive", "--burst")
    assert code == 0, out
    attempts = sorted(Run.objects.filter(job_id=job_id).values_list("attempt", flat=True))
    assert attempts == [1, 2]  # never the same attempt twice
    assert store.get_job(job_id) is None


# --- 7: a stale handle after bury, requeue and re-claim by the same worker id --------------


def test_7_a_stale_handle__cannot_touch_the_run_after_a_requeue(subprocess_env):
    q = store.queue("t.slow", max_attempts=1)
    job_id = q.enqueue({"sleep_s": 1.5})
    old = q.claim_one("w-same")
    lapse_claim(job_id)
    assert q.claim_one("someone") is None  # buries the exhausted lapsed claim
    assert operations.requeue_dead([job_id]) == 1
    proc = runworker(subprocess_env, "--queue", "t.slow", "--worker-id", "w-same", wait=False)
    try:
        assert wait_for(lambda: Run.objects.filter(job_id=job_id).exists())
        assert old.fail("stale handle") is False
        assert old.retry("stale handle") is False
        assert store.get_job(job_id).state == "processing"
        assert wait_for(lambda: store.get_job(job_id) is None)  # the new run is acked
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert not DeadJob.objects.filter(id=job_id).exists()


# --- 8: async def handlers --------------------------------------------------------------


def test_8_async_handlers__are_awaited_and_their_outcome_applied(subprocess_env):
    q = store.queue("h.async", max_attempts=1)
    ok = q.enqueue({})
    bad = q.enqueue({"raise": True})
    code, out = runworker(subprocess_env, "--queue", "h.async", "--burst")
    assert code == 0, out
    assert_acked_once([ok])
    assert DeadJob.objects.get(id=bad).last_error == "RuntimeError: async handler failed"
    assert Run.objects.filter(job_id=bad).count() == 1


# --- 9: the Tasks backend -----------------------------------------------------------------


@needs_django_tasks()
def test_9_tasks__unstorable_results_fail_clearly_and_unknown_aliases_are_dead_lettered(
    subprocess_env,
):
    from django.tasks import TaskResultStatus

    from tests.testapp import tasks

    nan = tasks.returns_nan.enqueue()
    nul = tasks.returns_nul.enqueue()
    orphan = store.queue("default").enqueue(
        {"task": "tests.testapp.tasks.add", "args": [1, 2], "kwargs": {}, "backend": "gone"}
    )
    code, out = runworker(subprocess_env, "--queue", "default", "--burst")
    assert code == 0, out
    for result in (nan, nul):
        failed = result.task.get_result(result.id)
        assert failed.status == TaskResultStatus.FAILED
        assert "returned a value that cannot be stored" in failed.errors[0].traceback
    dead = DeadJob.objects.get(id=orphan)
    assert "names TASKS alias 'gone', which is not configured" in dead.last_error
    assert "database unavailable" not in out


# --- 10: an outcome that rolls back is not reported as lost -------------------------------


def test_10_an_outcome_that_cannot_be_recorded__is_a_failed_attempt_and_the_worker_carries_on(
    subprocess_env,
):
    job_id, out = with_innocents(subprocess_env, "h.hook", max_attempts=1)
    dead = DeadJob.objects.get(id=job_id)
    assert dead.last_error == (
        "the ack outcome could not be recorded: RuntimeError: the result could not be written"
    )
    assert f"job id={job_id} queue=h.hook outcome=dead" in out
    assert "outcome=lost" not in out


# --- 11: a handler that holds the GIL stops the whole worker ------------------------------


def test_11_a_handler_holding_the_gil__its_sentinel_kills_the_worker_before_the_claim_lapses(
    subprocess_env,
):
    """No heartbeat, no time limit, no SIGTERM: the sentinel's watchdog ends the worker.

    It settles as for a dead worker: the stuck run's attempt is spent with the
    reason, the jobs prefetched behind it go back uncharged.
    """
    vt_s = 3
    stuck = store.queue("h.gil", visibility_timeout_s=vt_s, retry_base_s=60).enqueue(
        {"sleep_s": 120, "after_s": 0.5}
    )
    waiting = store.queue("t.record", visibility_timeout_s=vt_s).enqueue_many(["behind"] * 3)
    proc = runworker(
        subprocess_env, "--queue", "h.gil", "--queue", "t.record", "--concurrency", "1",
        wait=False, new_session=True,
    )  # fmt: skip
    try:
        assert wait_for(lambda: Run.objects.filter(job_id=stuck).exists(), timeout=60)
        started = time.monotonic()
        out, _ = proc.communicate(timeout=30)
        stopped_s = time.monotonic() - started
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL, out
    # Killed at a third of the lease, well before another worker could claim the job.
    assert stopped_s < vt_s, out
    job = store.get_job(stuck)
    assert (job.state, job.attempts) == ("pending", 1), out
    assert "made no progress for" in job.last_error
    assert "its sentinel killed it" in job.last_error
    for job_id in waiting:
        job = store.get_job(job_id)
        assert (job.state, job.attempts, job.last_error) == ("pending", 0, None), out
    assert Run.objects.filter(job_id=stuck).count() == 1


def test_11_a_loop_waiting_on_a_database_lock__is_not_killed_as_stalled_while_its_claims_hold(
    subprocess_env,
):
    """A loop blocked in a database call is not a handler holding the GIL.

    Another session holds the running job's row (the whole file on SQLite)
    across its heartbeat, so the loop stands still for longer than a third of
    the claim. The process's other threads still run, so its sentinel lets it
    wait: the claim cannot lapse before two thirds of it have passed. The job
    is acked at its first attempt; nothing is charged for the database's wait.
    """
    vt_s = 9
    job_id = store.queue("p.work", visibility_timeout_s=vt_s).enqueue({"sleep_s": 8})
    proc = runworker(subprocess_env, "--queue", "p.work", "--burst", wait=False, new_session=True)
    try:
        assert wait_for(lambda: Run.objects.filter(job_id=job_id).exists(), timeout=60)
        # The heartbeat is due a third of the claim after it began: hold the row
        # from just before it, long enough that the loop stands still past that
        # third but well before two thirds.
        time.sleep(vt_s / 3 - 0.7)
        with transaction.atomic():
            Job.objects.filter(id=job_id).update(priority=F("priority"))
            time.sleep(4.5)
        out, _ = proc.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out
    assert "made no progress" not in out
    assert_acked_once([job_id])
