"""The worker loop driven in-process: ``Worker(...).run(stop)``."""

from __future__ import annotations

import errno
import socket
import sys
import threading
import time

import pytest

from alkstore_django import store
from alkstore_django.errors import InvalidArgument
from alkstore_django.models import DeadJob, Job
from alkstore_django.worker import Worker
from alkstore_django.worker.instruments import Instruments
from alkstore_django.worker.loop import STOP_CHECK_S
from alkstore_django.worker.serving import JOB_THREAD
from tests.helpers import db_now, running_worker, runworker, wait_for
from tests.testapp.models import Run

pytestmark = pytest.mark.django_db(transaction=True)


def wait_for_run(job_id, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not Run.objects.filter(job_id=job_id).exists():
        assert time.monotonic() < deadline, f"job {job_id} never ran"
        time.sleep(0.005)


def run_burst(queues, **kwargs):
    kwargs.setdefault("poll_interval_s", 0.2)
    return Worker(queues, burst=True, **kwargs).run(threading.Event())


def test_burst__runs_every_due_job_exactly_once():
    ids = store.queue("t.record").enqueue_many([{"n": i} for i in range(50)])
    stats = run_burst(["t.record"], concurrency=3, batch=8)
    assert stats.acked == 50
    assert sorted(Run.objects.values_list("job_id", flat=True)) == ids
    assert not Job.objects.exists()


def test_raising_handler__is_retried_then_dead_lettered_with_its_error():
    q = store.queue("t.raise", max_attempts=2, retry_base_s=0)
    job_id = q.enqueue("x")
    run_burst(["t.raise"])
    run_burst(["t.raise"])
    dead = DeadJob.objects.get(id=job_id)
    assert dead.attempts == 2
    assert dead.last_error == "ValueError: boom x"
    assert Run.objects.filter(job_id=job_id).count() == 2


def test_fail__dead_letters_at_once_with_its_message():
    job_id = store.queue("t.fail", max_attempts=5).enqueue("x")
    stats = run_burst(["t.fail"])
    assert stats.dead == 1
    dead = store.get_job(job_id)
    assert dead.state == "dead"
    assert dead.attempts == 1
    assert dead.last_error == "refused: bad input"


def test_long_handler__is_kept_alive_by_heartbeats_and_runs_once():
    # Three times the visibility timeout: without heartbeats it would be re-run.
    job_id = store.queue("t.slow", visibility_timeout_s=0.6).enqueue({"sleep_s": 1.8})
    with running_worker(["t.slow"], worker_id="other") as other:
        stats = run_burst(["t.slow"], worker_id="main")
    assert stats.acked + other.stats.acked == 1
    assert Run.objects.filter(job_id=job_id).count() == 1
    assert not Job.objects.filter(id=job_id).exists()


def test_stop__records_a_job_still_running_after_the_grace_period_as_interrupted():
    job_id = store.queue("t.slow").enqueue({"sleep_s": 3})
    with running_worker(["t.slow"], grace_s=0.2) as worker:
        wait_for_run(job_id)
    job = store.get_job(job_id)
    # Never given back at the same attempt: the attempt is spent, the reason kept,
    # and the job runs again only after its backoff, as attempt 2.
    assert (job.state, job.attempts, job.worker_id) == ("pending", 1, None)
    assert job.last_error.startswith("interrupted: the worker shut down")
    assert job.run_at > db_now()
    assert (worker.stats.retried, worker.stats.released) == (1, 0)


def test_stop__releases_prefetched_jobs_that_never_started():
    q = store.queue("t.slow")
    first = q.enqueue({"sleep_s": 0.5})
    waiting = q.enqueue_many([{"sleep_s": 0}] * 3)
    with running_worker(["t.slow"], concurrency=1, batch=4, grace_s=5) as worker:
        wait_for_run(first)
    assert store.get_job(first) is None  # finished within the grace period
    for job_id in waiting:
        job = store.get_job(job_id)
        assert (job.state, job.attempts) == ("pending", 0)  # the attempt given back
    assert (worker.stats.acked, worker.stats.released) == (1, 3)


def test_stop__lets_a_short_job_finish_within_the_grace_period():
    job_id = store.queue("t.slow").enqueue({"sleep_s": 0.5})
    with running_worker(["t.slow"], grace_s=5) as worker:
        wait_for_run(job_id)
    assert worker.stats.acked == 1
    assert store.get_job(job_id) is None


def test_idle_worker__wakes_on_enqueue_without_waiting_for_the_poll():
    with running_worker(["t.record"], poll_interval_s=30):
        time.sleep(0.5)
        started = time.monotonic()
        wait_for_run(store.queue("t.record").enqueue("wake"))
        assert time.monotonic() - started < 2


class ClaimTimes(Instruments):
    """Instruments that note when each of the worker's claims ran."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def claim(self, queue: str, seconds: float) -> None:
        self.times.append(time.monotonic())


def test_idle_worker__claims_at_its_poll_interval__not_at_every_stop_check():
    claims = ClaimTimes()
    with running_worker(["t.record"], poll_interval_s=30, instruments=claims):
        wait_for(lambda: claims.times)
        # Past the rechecks a PostgreSQL worker makes just after it starts to
        # wait (two coalescing windows).
        time.sleep(0.2)
        seen = len(claims.times)
        time.sleep(4 * STOP_CHECK_S + 0.1)
        assert len(claims.times) == seen


def test_idle_worker__claims_for_a_wake_up_set_just_after_its_round_looked(monkeypatch):
    """A ``set`` from another thread between the loop's look at the flag and its clear.

    The loop used to clear the flag whatever it had seen, so that set (a
    watcher's notification) was lost and the job waited for the poll.
    """
    claims = ClaimTimes()
    with running_worker(["t.record"], poll_interval_s=30, instruments=claims) as worker:
        wait_for(lambda: claims.times)
        time.sleep(0.2)  # idle, past the rechecks just after it starts to wait
        seen = len(claims.times)
        wake, armed = worker.wake, threading.Event()
        look = wake.is_set

        def racing_look() -> bool:
            flag = look()
            # Only the loop's own look (in Worker.run), not the waits' or set's.
            if armed.is_set() and sys._getframe(1).f_code.co_name == "run":
                armed.clear()
                setter = threading.Thread(target=wake.set)
                setter.start()
                setter.join()
            return flag

        monkeypatch.setattr(wake, "is_set", racing_look)
        armed.set()
        assert wait_for(lambda: not armed.is_set(), timeout=2)
        assert wait_for(lambda: len(claims.times) > seen, timeout=4 * STOP_CHECK_S)


def test_worker__whose_wake_up_cannot_open__stops_its_job_threads_and_says_why(monkeypatch):
    def no_more_files():
        raise OSError(errno.EMFILE, "Too many open files")

    def job_threads() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name.startswith(JOB_THREAD)}

    before = job_threads()
    monkeypatch.setattr(socket, "socketpair", no_more_files)
    with pytest.raises(OSError, match="Too many open files"):
        Worker(["t.record"], poll_interval_s=0.1).run(threading.Event())
    assert wait_for(lambda: not job_threads() - before, timeout=5)


def test_idle_worker__still_polls_every_poll_interval():
    claims = ClaimTimes()
    with running_worker(["t.record"], poll_interval_s=0.5, instruments=claims):
        wait_for(lambda: claims.times)
        started = time.monotonic()
        time.sleep(1.7)
        polls = [t for t in claims.times if t > started + 0.1]
        assert 2 <= len(polls) <= 4, [round(t - started, 3) for t in claims.times]


def test_idle_worker__runs_a_job_another_claimer_released_without_waiting_for_its_poll():
    q = store.queue("t.record", visibility_timeout_s=60)
    job_id = q.enqueue("released")
    held = q.claim_one("another-worker")
    assert held.job.id == job_id
    claims = ClaimTimes()
    with running_worker(["t.record"], poll_interval_s=30, instruments=claims):
        wait_for(lambda: claims.times)
        time.sleep(0.3)  # idle: its queue drained, its poll and the claim's lapse far off
        started = time.monotonic()
        assert held.release()
        wait_for_run(job_id)
        assert time.monotonic() - started < 2


def test_idle_worker__runs_the_retry_of_a_killed_workers_job_when_it_is_due(subprocess_env):
    q = store.queue("t.slow", retry_base_s=0.5, visibility_timeout_s=60)
    doomed = runworker(subprocess_env, "--queue", "t.slow", wait=False)
    try:
        job_id = q.enqueue({"sleep_s": 4.0})
        assert wait_for(lambda: Run.objects.filter(job_id=job_id).exists(), timeout=60)
        claims = ClaimTimes()
        with running_worker(["t.slow"], poll_interval_s=30, instruments=claims):
            wait_for(lambda: claims.times)
            time.sleep(0.3)  # idle: its poll and the running claim's lapse far off
            killed = time.monotonic()
            doomed.kill()  # the worker alone: its sentinel retries the job
            assert wait_for(lambda: Run.objects.filter(job_id=job_id).count() == 2, timeout=5)
            # Its backoff (0.25-0.5 s) and the sentinel's look, not the poll.
            assert time.monotonic() - killed < 3
    finally:
        doomed.kill()
        doomed.communicate(timeout=30)


def test_idle_worker__wakes_when_a_delayed_job_becomes_due():
    with running_worker(["t.record"], poll_interval_s=30):
        time.sleep(0.3)
        job_id = store.queue("t.record").enqueue("later", delay_s=1.0)
        started = time.monotonic()
        wait_for_run(job_id)
        assert 0.8 <= time.monotonic() - started < 3


def test_unknown_queue__is_refused_with_the_registered_names():
    with pytest.raises(InvalidArgument, match="No handler registered for queue 'nope'"):
        Worker(["nope"], burst=True).run(threading.Event())


def test_sweep__buries_exhausted_lapsed_claims_of_a_queue_nobody_claims_from():
    from tests.helpers import lapse_claim

    orphan = store.queue("t.orphaned", max_attempts=1)
    job_id = orphan.enqueue("x")
    assert orphan.claim_one("gone-worker").job.id == job_id
    lapse_claim(job_id)
    run_burst(["t.noop"])
    dead = DeadJob.objects.get(id=job_id)
    assert (dead.queue, dead.attempts, dead.last_error) == (
        "t.orphaned",
        1,
        "max attempts exceeded",
    )


@pytest.mark.parametrize("pool", ["threads", "asyncio"])
def test_jobs_held_when_their_queue_is_paused__go_back_unstarted(pool):
    q = store.queue("t.slow")
    first = q.enqueue({"sleep_s": 1.0})
    rest = q.enqueue_many([{"sleep_s": 0}] * 4)
    # One slot and room for five: the four wait behind the first, held under claim.
    with running_worker(["t.slow"], concurrency=1, batch=5, pool=pool):
        wait_for_run(first)
        q.pause()
        assert wait_for(lambda: store.get_job(first) is None, timeout=10)
        time.sleep(0.5)
    assert list(Run.objects.values_list("job_id", flat=True)) == [first]
    for job_id in rest:
        job = store.get_job(job_id)
        assert (job.state, job.attempts) == ("pending", 0)
