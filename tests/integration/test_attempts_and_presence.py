"""Attempt history and the live-worker list."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from django.test import override_settings

from alkstore_django import overview, presence, store
from alkstore_django.history import OrphanSweep, attempts_of
from alkstore_django.models import Attempt, LiveWorker
from alkstore_django.testing import run_ready_jobs
from alkstore_django.worker import Worker
from tests.helpers import ALKSTORE_DB, ROUTING, make_due, runworker, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_attempt_history__a_dead_letter_keeps_every_failed_attempt():
    job_id = store.queue("t.raise", max_attempts=3).enqueue("p")
    for _ in range(3):
        [run] = run_ready_jobs(["t.raise"], worker_id="tester")
        make_due(job_id)
    assert run.outcome == "dead"
    history = attempts_of(job_id, ALKSTORE_DB)
    assert [(a.attempt, a.error, a.worker_id) for a in history] == [
        (n, "ValueError: boom p", "tester") for n in (1, 2, 3)
    ]
    assert all(a.exception_class == "builtins.ValueError" for a in history)
    assert all("raise ValueError" in a.traceback for a in history)
    assert all(a.failed_at is not None for a in history)


def test_attempt_history__of_a_job_that_is_gone_is_purged():
    job_id = store.queue("t.raise", max_attempts=2).enqueue("p")
    run_ready_jobs(["t.raise"])  # one failed attempt; the retry waits for its backoff
    sweep = OrphanSweep()
    assert sweep.run(ALKSTORE_DB) == 0  # its job is live
    assert store.queue("t.raise").cancel(job_id)
    assert sweep.run(ALKSTORE_DB) == 1
    assert not Attempt.objects.exists()


def test_live_workers__a_running_worker_is_listed_with_its_counts_and_leaves_on_stop():
    store.queue("t.record").enqueue_many([1, 2, 3])
    stop = threading.Event()
    worker = Worker(["t.record"], worker_id="listed", poll_interval_s=0.1)
    thread = threading.Thread(target=worker.run, args=(stop,))
    thread.start()
    try:
        assert wait_for(lambda: worker.stats.acked == 3)
        # The next announcement carries the counts.
        worker.upkeep.hurry("announce")
        assert wait_for(lambda: [w.acked for w in presence.live_workers(ALKSTORE_DB)] == [3])
        [row] = presence.live_workers(ALKSTORE_DB)
        assert (row.worker_id, row.queues, row.pool, row.pid) == (
            "listed",
            ["t.record"],
            "threads",
            os.getpid(),
        )
    finally:
        stop.set()
        thread.join(10)
    assert presence.live_workers(ALKSTORE_DB) == []


def test_live_workers__one_sigkilled_with_its_sentinel_is_gone_after_its_ttl(subprocess_env):
    proc = runworker(
        subprocess_env, "--queue", "t.record", "--worker-id", "doomed", wait=False, new_session=True
    )
    assert wait_for(lambda: LiveWorker.objects.filter(worker_id="doomed").exists())
    os.killpg(proc.pid, signal.SIGKILL)  # the worker and its sentinel: nobody says goodbye
    proc.communicate(timeout=10)
    assert LiveWorker.objects.filter(worker_id="doomed").exists()
    with override_settings(ALKSTORE={**ROUTING, "WORKER_TTL_S": 1.0}):
        time.sleep(1.2)
        assert [w.worker_id for w in presence.live_workers(ALKSTORE_DB)] == []


def test_overview__flags_a_queue_with_jobs_and_no_live_worker():
    store.queue("t.record").enqueue("waiting")
    [row] = [s for s in overview.queue_overview() if s.queue == "t.record"]
    assert (row.consumers, row.unconsumed) == (0, True)
    presence.announce(
        ALKSTORE_DB, "w1", queues=["t.record"], pool="threads", concurrency=1, counts=(0, 0, 0)
    )
    [row] = [s for s in overview.queue_overview() if s.queue == "t.record"]
    assert (row.consumers, row.unconsumed) == (1, False)


def test_attempt_history__a_class_name_longer_than_its_column_keeps_the_real_error():
    job_id = store.queue("h.long-class-name", max_attempts=1).enqueue("p")

    [run] = run_ready_jobs(["h.long-class-name"])

    assert run.outcome == "dead"
    assert run.error.endswith("Error: the real error") and "could not be recorded" not in run.error
    [attempt] = attempts_of(job_id, ALKSTORE_DB)
    assert attempt.error == run.error
    width = Attempt._meta.get_field("exception_class").max_length
    assert len(attempt.exception_class) <= width
    assert attempt.exception_class.startswith("tests.testapp.hostile_jobs.Long")
    assert attempt.exception_class.endswith("NNNError")
