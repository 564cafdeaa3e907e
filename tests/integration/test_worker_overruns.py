"""Runs that outlive their claim or their time limit, the worker driven in-process.

A worker stalled past its claims takes its own lapsed jobs back; a thread past
its job's ``timeout_s`` is stopped by a time-out raised inside it. Either way
the worker's bookkeeping must hold: one hold per claim, no claim run once it
is superseded, no job due again while its last run goes on.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import Counter

import pytest

from alkstore_django import store
from alkstore_django.models import DeadJob, Job
from alkstore_django.worker import Worker
from tests.helpers import lapse_claim, live_count, running_worker, wait_for
from tests.testapp.jobs import PEAK_SPINNING
from tests.testapp.models import Run

pytestmark = pytest.mark.django_db(transaction=True)


def runs_of(job_id: int) -> list[int]:
    return sorted(Run.objects.filter(job_id=job_id).values_list("attempt", flat=True))


def assert_nothing_held(worker: Worker) -> None:
    assert len(worker.holdings) == 0
    assert worker.holdings.slots.held() == []


# --- a worker that takes back its own lapsed claims ---------------------------------


def test_own_lapsed_claims__taken_back_by_the_same_worker_supersede_the_held_ones_unrun():
    """The prefetched claims lapse while the one thread is busy; the worker claims them again."""
    slow = store.queue("t.slow", visibility_timeout_s=30)
    busy = slow.enqueue({"sleep_s": 1.5})
    waiting = slow.enqueue_many([{"sleep_s": 0}] * 3)
    with running_worker(["t.slow"], concurrency=1, batch=8) as worker:
        assert wait_for(lambda: runs_of(busy) == [1], timeout=10)
        for job_id in waiting:
            lapse_claim(job_id)
        assert wait_for(lambda: live_count("t.slow") == 0, timeout=15)
        assert wait_for(lambda: len(worker.holdings) == 0, timeout=5)
        assert_nothing_held(worker)
    assert runs_of(busy) == [1]
    for job_id in waiting:
        # The lapsed claims (attempt 1) were superseded before they started: never run.
        assert runs_of(job_id) == [2]
    assert worker.stats.acked == 4


def test_own_lapsed_claims__taken_back_round_after_round_leak_no_slot_and_the_worker_lives():
    """Every claim lapses, five times over, under a worker that holds what it claimed."""
    queue = store.queue("t.slow", visibility_timeout_s=30, max_attempts=20, retry_base_s=0)
    ids = queue.enqueue_many([{"sleep_s": 0.05}] * 40)
    with running_worker(["t.slow"], concurrency=2, batch=8) as worker:
        for _ in range(5):
            time.sleep(0.3)
            for job_id in Job.objects.filter(state="processing").values_list("id", flat=True):
                lapse_claim(job_id)
        assert wait_for(lambda: live_count("t.slow") == 0, timeout=30)
        assert wait_for(lambda: len(worker.holdings) == 0, timeout=5)
        assert_nothing_held(worker)
    runs = Counter(Run.objects.filter(job_id__in=ids).values_list("job_id", "attempt"))
    assert max(runs.values()) == 1  # no (job, attempt) run twice
    assert not DeadJob.objects.exists()


# --- a thread past its time limit --------------------------------------------------------


def test_time_limit__a_thread_past_it_is_stopped_before_its_job_can_run_again_anywhere():
    """Two workers: the one that did not run attempt 1 must not start attempt 2 beside it."""
    queue = store.queue("t.spin", max_attempts=2, retry_base_s=0)
    job_id = queue.enqueue({"spin_s": 3.0}, timeout_s=0.5)
    with running_worker(["t.spin"], grace_s=5) as one, running_worker(["t.spin"], grace_s=5) as two:
        assert wait_for(lambda: DeadJob.objects.filter(id=job_id).exists(), timeout=15)
    assert PEAK_SPINNING[job_id] == 1
    dead = DeadJob.objects.get(id=job_id)
    assert (dead.attempts, dead.last_error) == (2, "timed out after 0.5 s")
    assert runs_of(job_id) == [1, 2]
    assert not one.timed_out and not two.timed_out


def test_time_limit__a_stopped_thread_frees_its_slot_and_the_worker_goes_on(caplog):
    spin = store.queue("t.spin", max_attempts=1)
    overrun = spin.enqueue({"spin_s": 30.0}, timeout_s=0.5)
    with (
        caplog.at_level(logging.INFO, logger="alkstore_django.worker"),
        running_worker(["t.spin", "t.record"], concurrency=1, batch=1) as worker,
    ):
        assert wait_for(lambda: DeadJob.objects.filter(id=overrun).exists(), timeout=10)
        after = store.queue("t.record").enqueue("after")
        assert wait_for(lambda: store.get_job(after) is None, timeout=10)
        assert_nothing_held(worker)
    assert DeadJob.objects.get(id=overrun).last_error == "timed out after 0.5 s"
    assert not worker.timed_out
    assert (worker.stats.dead, worker.stats.acked) == (1, 1)
    line = next(r.getMessage() for r in caplog.records if f"id={overrun} " in r.getMessage()
                and "outcome=dead" in r.getMessage())  # fmt: skip
    duration_ms = float(re.search(r"duration_ms=([\d.]+)", line).group(1))
    assert 500 <= duration_ms < 5_000, line


def test_time_limit__a_thread_that_does_not_stop_keeps_its_job_claimed_and_stops_the_worker():
    """``time.sleep`` is inside C: the raised time-out cannot land until it returns."""
    job_id = store.queue("t.slow", max_attempts=3, retry_base_s=0).enqueue(
        {"sleep_s": 6}, timeout_s=0.5
    )
    started = time.monotonic()
    worker = Worker(["t.slow"], burst=True, grace_s=0.5, poll_interval_s=0.1)
    worker.run(threading.Event())
    assert time.monotonic() - started < 5
    assert worker.timed_out
    # Not due again while its run goes on: still under this worker's claim, no attempt
    # recorded (the sentinel records it once the process has exited).
    job = store.get_job(job_id)
    assert (job.state, job.worker_id, job.attempts, job.last_error) == (
        "processing",
        worker.worker_id,
        1,
        None,
    )
    assert worker.running_threads() == 1


def test_own_lapsed_claims__a_superseded_run_in_a_child_is_ended_not_left_running(tmp_path):
    """Process pool: the claim of a running job lapses and the worker claims the job again.

    The child still running the superseded claim is ended (its outcome is void);
    only the new claim's run finishes.
    """
    log = tmp_path / "runs.log"
    queue = store.queue("t.tracked", visibility_timeout_s=30, max_attempts=3)
    job_id = queue.enqueue({"log": str(log), "sleep_s": 4})
    with running_worker(["t.tracked"], pool="processes", concurrency=2, batch=2) as worker:
        assert wait_for(lambda: log.exists() and "start" in log.read_text(), timeout=30)
        lapse_claim(job_id)
        assert wait_for(lambda: live_count("t.tracked") == 0, timeout=30)
        assert wait_for(lambda: len(worker.holdings) == 0, timeout=5)
    lines = [line.split()[0] for line in log.read_text().splitlines()]
    assert lines == ["start", "start", "end"]
    assert worker.stats.acked == 1
