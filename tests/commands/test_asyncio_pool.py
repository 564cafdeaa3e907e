"""``runworker --pool asyncio``: many ``async def`` handlers at once on one event loop.

Real worker subprocesses on the test database, as the other pools' tests:
throughput when handlers wait, time limits (a coroutine cancelled at its
limit, one that swallows the cancellation), grace and SIGTERM, SIGKILL and
the sentinel, snooze and ``Fail``, a cancel request, and a sync handler in
the pool's thread executor.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest

from alkstore_django import store
from alkstore_django.models import DeadJob, Job
from tests.helpers import assert_acked_once, runworker, wait_for
from tests.testapp.models import Run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]


def asyncio_worker(env, *args, **kwargs):
    return runworker(env, "--pool", "asyncio", *args, **kwargs)


@contextlib.contextmanager
def running_worker(env, *args):
    """Yield a worker process; kill it and its sentinel if the test leaves them running.

    A worker left behind by a failed test would go on claiming the next tests' jobs.
    """
    proc = asyncio_worker(env, *args, wait=False, new_session=True)
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc.returncode is None:
            proc.communicate(timeout=10)


def test_2000_jobs_that_wait_200ms__drain_in_under_10s_on_one_loop(subprocess_env):
    # Four threads would take 2000 * 0.2 / 4 = 100 s; 200 coroutines, about 2 s.
    ids = store.queue("a.io").enqueue_many([{"sleep_s": 0.2, "record": False}] * 2000)
    args = ("--queue", "a.io", "--concurrency", "200", "--burst")
    with running_worker(subprocess_env, *args) as proc:
        # The clock starts once the worker has booted: its first claim.
        assert wait_for(lambda: Job.objects.filter(state="processing").exists(), timeout=60)
        started = time.monotonic()
        out, _ = proc.communicate(timeout=120)
        elapsed = time.monotonic() - started
    assert proc.returncode == 0, out
    assert not Job.objects.filter(id__in=ids).exists()
    assert not DeadJob.objects.filter(id__in=ids).exists()
    assert elapsed < 10, f"drained in {elapsed:.1f} s"


def test_async_orm_fail_snooze_and_errors__settle_as_in_the_thread_pool(subprocess_env):
    q = store.queue("a.io", max_attempts=2, retry_base_s=0)
    ok = q.enqueue_many([{}] * 5)
    failed = q.enqueue({"fail": True})
    raising = q.enqueue({"raise": True})
    snoozed = q.enqueue({"snooze_s": 30})
    code, out = asyncio_worker(subprocess_env, "--queue", "a.io", "--burst")
    assert code == 0, out
    assert_acked_once(ok)  # each recorded its run through the async ORM
    assert DeadJob.objects.get(id=failed).last_error == "refused by the coroutine"
    dead = DeadJob.objects.get(id=raising)
    assert dead.attempts == 2
    assert dead.last_error == f"ValueError: coroutine boom {raising}"
    # Put off without spending an attempt (a burst worker does not wait for it).
    job = store.get_job(snoozed)
    assert (job.state, job.snoozes) == ("pending", 1)
    assert Run.objects.filter(job_id=snoozed).count() == 1


def test_a_coroutine_past_its_time_limit__is_cancelled_retried_then_dead_lettered(subprocess_env):
    q = store.queue("a.io", max_attempts=2, retry_base_s=0)
    slow = q.enqueue({"sleep_s": 30}, timeout_s=1)
    innocent = q.enqueue_many([{"sleep_s": 0.1}] * 6)
    started = time.monotonic()
    code, out = asyncio_worker(subprocess_env, "--queue", "a.io", "--burst")
    assert code == 0, out
    dead = DeadJob.objects.get(id=slow)
    assert (dead.attempts, dead.last_error) == (2, "timed out after 1 s")
    assert Run.objects.filter(job_id=slow).count() == 2
    assert_acked_once(innocent)
    assert time.monotonic() - started < 25


def test_a_coroutine_that_swallows_its_cancellation__is_reported_and_its_slot_reclaimed(
    subprocess_env,
):
    q = store.queue("a.io", max_attempts=1)
    deaf = q.enqueue({"swallow": 20}, timeout_s=1)
    # One slot: the jobs behind the deaf one run only once its slot is taken back.
    behind = q.enqueue_many([{}] * 3)
    started = time.monotonic()
    code, out = asyncio_worker(
        subprocess_env, "--queue", "a.io", "--concurrency", "1", "--burst", "--grace-s", "1"
    )
    assert code == 0, out
    assert "handler ignored its cancellation" in out
    dead = DeadJob.objects.get(id=deaf)
    assert (dead.attempts, dead.last_error) == (1, "timed out after 1 s")
    assert_acked_once(behind)
    assert time.monotonic() - started < 15  # not the 20 s the coroutine wanted
    assert Run.objects.filter(job_id=deaf).count() == 1


def test_sigterm__running_coroutines_finish_within_grace(subprocess_env):
    q = store.queue("a.io", retry_base_s=0)
    short = q.enqueue_many([{"sleep_s": 1}] * 20)
    args = ("--queue", "a.io", "--concurrency", "50", "--grace-s", "10")
    with running_worker(subprocess_env, *args) as proc:
        assert wait_for(lambda: Run.objects.filter(job_id__in=short).count() == 20, timeout=60)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert_acked_once(short)


def test_sigterm__a_coroutine_past_the_grace_is_cancelled_and_recorded_interrupted(
    subprocess_env,
):
    job_id = store.queue("a.io", retry_base_s=0).enqueue({"sleep_s": 60})
    with running_worker(subprocess_env, "--queue", "a.io", "--grace-s", "0.5") as proc:
        assert wait_for(lambda: Run.objects.filter(job_id=job_id).exists(), timeout=60)
        proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert time.monotonic() - started < 8
    job = store.get_job(job_id)
    assert (job.state, job.attempts) == ("pending", 1)
    assert job.last_error.startswith("interrupted: the worker shut down")
    assert Run.objects.filter(job_id=job_id).count() == 1


def test_sigkill__the_sentinel_settles_what_the_loop_held(subprocess_env):
    q = store.queue("a.io", retry_base_s=0)
    running = q.enqueue_many([{"sleep_s": 60}] * 5)
    with running_worker(subprocess_env, "--queue", "a.io", "--concurrency", "10") as proc:
        assert wait_for(lambda: Run.objects.filter(job_id__in=running).count() == 5, timeout=60)
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
        # Its sentinel records each running attempt at once, without waiting for the claims.
        settled = lambda: all(store.get_job(i).state == "pending" for i in running)  # noqa: E731
        assert wait_for(settled, timeout=20)
    for job_id in running:
        job = store.get_job(job_id)
        assert (job.attempts, job.worker_id) == (1, None)
        assert "worker" in job.last_error


def test_a_cancel_request__reaches_the_coroutine_and_ends_the_job_cancelled(subprocess_env):
    job_id = store.queue("a.io").enqueue({"heed_cancel": True})
    with running_worker(subprocess_env, "--queue", "a.io", "--grace-s", "1") as proc:
        assert wait_for(lambda: Run.objects.filter(job_id=job_id).exists(), timeout=60)
        assert store.cancel_job(job_id)
        assert wait_for(lambda: store.get_job(job_id) is None, timeout=15)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "cancelled" in out


def test_sync_handlers__run_in_the_pools_threads_with_the_thread_pools_time_limit(
    subprocess_env,
):
    q = store.queue("a.sync", max_attempts=1)
    ids = q.enqueue_many([{"sleep_s": 0.2}] * 8)
    looping = q.enqueue({"loop": True}, timeout_s=1)
    started = time.monotonic()
    code, out = asyncio_worker(subprocess_env, "--queue", "a.sync", "--concurrency", "8", "--burst")
    assert code == 0, out
    assert_acked_once(ids)
    dead = DeadJob.objects.get(id=looping)
    assert dead.last_error == "timed out after 1 s"
    assert time.monotonic() - started < 20


def test_a_coroutine_longer_than_its_visibility_timeout__keeps_its_claim_and_runs_once(
    subprocess_env,
):
    # The claims are renewed by the worker's main thread while the loop waits.
    ids = store.queue("a.io", visibility_timeout_s=1).enqueue_many([{"sleep_s": 3}] * 20)
    code, out = asyncio_worker(subprocess_env, "--queue", "a.io", "--concurrency", "20", "--burst")
    assert code == 0, out
    assert_acked_once(ids)


def test_max_running_2__holds_on_the_loop(settings_variant):
    env = settings_variant("ALKSTORE = {**ALKSTORE, 'QUEUES': {'a.io': {'max_running': 2}}}")
    ids = store.queue("a.io").enqueue_many([{"sleep_s": 0.3}] * 10)
    peak = 0
    with running_worker(env, "--queue", "a.io", "--concurrency", "50", "--burst") as proc:
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            peak = max(peak, Job.objects.filter(queue="a.io", state="processing").count())
            time.sleep(0.02)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert_acked_once(ids)
    assert peak == 2  # reached, never exceeded, with 50 slots free
