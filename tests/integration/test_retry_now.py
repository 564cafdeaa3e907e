"""Retry now: jobs waiting for a retry become due at once, by id or by queue."""

from __future__ import annotations

import pytest

from alkstore_django import store
from alkstore_django.errors import InvalidArgument
from alkstore_django.operations import not_waiting, retry_now
from tests.helpers import db_now

pytestmark = pytest.mark.django_db(transaction=True)


def waiting_job(queue: str = "rn", delay_s: float = 3600) -> int:
    """Enqueue, claim and retry a job: it waits ``delay_s`` for its next attempt."""
    q = store.queue(queue)
    job_id = q.enqueue({"q": queue})
    handle = q.claim_one("w")
    assert handle.job.id == job_id
    assert handle.retry("boom", delay_s=delay_s)
    return job_id


def test_retry_now__by_id_makes_the_job_claimable_with_its_attempts_kept():
    job_id = waiting_job()
    other = waiting_job()
    assert store.queue("rn").claim_one("w") is None
    assert retry_now([job_id]) == 1
    job = store.get_job(job_id)
    assert job.run_at <= db_now()
    assert (job.attempts, job.last_error) == (1, "boom")
    handle = store.queue("rn").claim_one("w")
    assert (handle.job.id, handle.job.attempts) == (job_id, 2)
    assert store.get_job(other).run_at > db_now()


def test_retry_now__by_queue_changes_only_that_queues_waiting_jobs():
    mine = [waiting_job("rn"), waiting_job("rn")]
    theirs = waiting_job("rn.other")
    delayed = store.queue("rn").enqueue({}, delay_s=3600)  # never attempted: not a retry
    assert retry_now(queue="rn") == 2
    assert all(store.get_job(i).run_at <= db_now() for i in mine)
    assert store.get_job(theirs).run_at > db_now()
    assert store.get_job(delayed).run_at > db_now()


def test_retry_now__leaves_running_and_due_jobs_alone():
    q = store.queue("rn")
    due_id = q.enqueue({})
    running = q.claim_one("w")
    due_again = q.enqueue({})
    assert retry_now([due_id, due_again, 999_999]) == 0
    assert store.get_job(running.job.id).state == "processing"
    assert not_waiting([due_id, due_again, 999_999]) == sorted([due_id, due_again, 999_999])


def test_not_waiting__names_ids_outside_the_queue():
    job_id = waiting_job("rn")
    assert not_waiting([job_id], queue="rn") == []
    assert not_waiting([job_id], queue="rn.other") == [job_id]


def test_retry_now__needs_ids_or_a_queue():
    with pytest.raises(InvalidArgument, match="Nothing to retry"):
        retry_now()
    with pytest.raises(InvalidArgument, match="Invalid job id 'x'"):
        retry_now(["x"])
