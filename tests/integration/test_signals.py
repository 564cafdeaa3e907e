"""``job_enqueued``, ``job_started`` and ``job_finished`` for ``@handler`` jobs."""

from __future__ import annotations

import threading

import pytest

from alkstore_django import store
from alkstore_django.signals import job_enqueued, job_finished, job_started
from alkstore_django.testing import run_ready_jobs
from alkstore_django.worker import Worker

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def heard():
    """Connect a recorder to the three signals for the test's duration."""
    events = []

    def enqueued(sender, job_ids, **kwargs):
        events.append(("enqueued", sender, tuple(job_ids)))

    def started(sender, job, **kwargs):
        events.append(("started", sender, job.id))

    def finished(sender, job, outcome, result, **kwargs):
        events.append(("finished", sender, job.id, result, outcome.error))

    job_enqueued.connect(enqueued)
    job_started.connect(started)
    job_finished.connect(finished)
    yield events
    job_enqueued.disconnect(enqueued)
    job_started.disconnect(started)
    job_finished.disconnect(finished)


def test_enqueue__sends_job_enqueued_with_the_ids_and_the_queue_as_sender(heard):
    one = store.queue("t.record").enqueue("a")
    many = store.queue("t.noop").enqueue_many(["b", "c"])
    assert heard == [("enqueued", "t.record", (one,)), ("enqueued", "t.noop", tuple(many))]


def test_worker__sends_started_and_finished_once_each_outcome_is_durable(heard):
    ok = store.queue("t.record").enqueue("a")
    bad = store.queue("t.raise", max_attempts=1).enqueue("b")
    heard.clear()
    Worker(["t.record", "t.raise"], burst=True).run(threading.Event())
    assert sorted(e for e in heard if e[0] == "started") == [
        ("started", "t.raise", bad),
        ("started", "t.record", ok),
    ]
    assert sorted(e for e in heard if e[0] == "finished") == [
        ("finished", "t.raise", bad, "dead", "ValueError: boom b"),
        ("finished", "t.record", ok, "acked", None),
    ]


def test_a_receiver_that_raises__changes_no_outcome(heard):
    def broken(sender, **kwargs):
        raise RuntimeError("receiver bug")

    job_finished.connect(broken)
    try:
        job_id = store.queue("t.record").enqueue("a")
        [run] = run_ready_jobs(["t.record"])
    finally:
        job_finished.disconnect(broken)
    assert (run.job_id, run.outcome) == (job_id, "acked")
    assert store.get_job(job_id) is None
    assert ("finished", "t.record", job_id, "acked", None) in heard
