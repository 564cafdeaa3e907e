"""The fenced handle: ack, retry, fail, heartbeat, release, and when each refuses."""

from __future__ import annotations

import pytest

from alkstore_django import store
from tests.helpers import ALKSTORE_DB, db_now, dead_count, lapse_claim, live_count, make_due

pytestmark = pytest.mark.django_db

OPERATIONS = {
    "ack": lambda h: h.ack(),
    "retry": lambda h: h.retry("boom"),
    "retry_with_delay": lambda h: h.retry("boom", delay_s=0),
    "fail": lambda h: h.fail("bad"),
    "heartbeat": lambda h: h.heartbeat(600),
    "release": lambda h: h.release(),
}


def claimed(queue="handles", **opts):
    q = store.queue(queue, **opts)
    job_id = q.enqueue({"p": 1})
    handle = q.claim_one("w1")
    assert handle.job.id == job_id
    return q, handle


def test_ack__deletes_the_row():
    _, handle = claimed()
    assert handle.ack() is True
    assert store.get_job(handle.job.id) is None
    assert dead_count() == 0


def test_retry__returns_the_job_to_pending_after_delay_keeping_the_attempt():
    q, handle = claimed()
    assert handle.retry("timeout", delay_s=30) is True
    job = store.get_job(handle.job.id)
    assert (job.state, job.attempts, job.worker_id, job.claim_expires_at) == (
        "pending",
        1,
        None,
        None,
    )
    assert job.last_error == "timeout"
    assert 28 < (job.run_at - db_now()).total_seconds() <= 30
    assert q.claim_one("w2") is None


def test_retry__with_zero_delay_is_claimable_again_as_the_next_attempt():
    q, handle = claimed()
    assert handle.retry(delay_s=0) is True
    again = q.claim_one("w2")
    assert again.job.id == handle.job.id and again.job.attempts == 2
    assert again.job.last_error is None


def test_retry__on_the_last_attempt_dead_letters_with_the_error_verbatim():
    _, handle = claimed(max_attempts=1)
    assert handle.retry("SMTP said: 550 'no'") is True
    dead = store.get_job(handle.job.id)
    assert (dead.state, dead.last_error, dead.attempts) == ("dead", "SMTP said: 550 'no'", 1)
    assert live_count() == 0


def test_retry__on_the_last_attempt_without_error_says_max_attempts_exceeded():
    q, handle = claimed(max_attempts=2)
    assert handle.retry(delay_s=0) is True
    last = q.claim_one("w2")
    assert last.retry() is True
    assert store.get_job(handle.job.id).last_error == "max attempts exceeded"


def test_fail__dead_letters_at_once_with_the_error_verbatim():
    _, handle = claimed(max_attempts=5)
    assert handle.fail("invalid address") is True
    dead = store.get_job(handle.job.id)
    assert (dead.state, dead.last_error, dead.attempts) == ("dead", "invalid address", 1)
    assert dead.died_at is not None and dead.payload == {"p": 1}


def test_fail__without_error_says_failed():
    _, handle = claimed()
    assert handle.fail() is True
    assert store.get_job(handle.job.id).last_error == "failed"


def test_dead_letter__keeps_the_stamps_of_the_live_row():
    _, handle = claimed(visibility_timeout_s=45, retry_base_s=2, priority=3, max_attempts=4)
    handle.fail()
    dead = store.get_job(handle.job.id)
    live = handle.job
    for field in ("queue", "payload", "priority", "run_at", "attempts", "max_attempts"):
        assert getattr(dead, field) == getattr(live, field), field
    assert (dead.visibility_timeout_s, dead.retry_base_s) == (45, 2)
    assert dead.enqueued_at == live.enqueued_at and dead.worker_id == "w1"
    assert dead.claim_expires_at is None


def test_heartbeat__is_an_absolute_reset_not_an_extension():
    _, handle = claimed(visibility_timeout_s=300)
    assert handle.heartbeat(10) is True
    left = (store.get_job(handle.job.id).claim_expires_at - db_now()).total_seconds()
    assert 8 < left <= 10
    assert handle.heartbeat(1000) is True
    assert handle.heartbeat(1000) is True
    left = (store.get_job(handle.job.id).claim_expires_at - db_now()).total_seconds()
    assert 998 < left <= 1000


def test_heartbeat__keeps_the_handle_usable():
    _, handle = claimed()
    assert handle.heartbeat(60) is True
    assert handle.spent is False
    assert handle.ack() is True


def test_heartbeat__is_refused_once_the_deadline_has_passed():
    _, handle = claimed()
    lapse_claim(handle.job.id)
    before = store.get_job(handle.job.id)
    assert handle.heartbeat(600) is False
    assert store.get_job(handle.job.id) == before


def test_release__returns_the_job_at_once_and_gives_the_attempt_back():
    q, handle = claimed()
    run_at = handle.job.run_at
    assert handle.release() is True
    job = store.get_job(handle.job.id)
    assert (job.state, job.attempts, job.worker_id, job.run_at) == ("pending", 0, None, run_at)
    assert q.claim_one("w2").job.attempts == 1


@pytest.mark.parametrize("op", OPERATIONS)
def test_handle__refuses_every_operation_after_its_claim_lapsed(op):
    _, handle = claimed()
    lapse_claim(handle.job.id)
    before = store.get_job(handle.job.id)
    assert OPERATIONS[op](handle) is False
    assert store.get_job(handle.job.id) == before
    assert dead_count() == 0


@pytest.mark.parametrize("op", OPERATIONS)
def test_handle__refuses_every_operation_after_the_job_was_reclaimed(op):
    q, stale = claimed()
    lapse_claim(stale.job.id)
    # The same worker id: only the attempt fences the stale handle off.
    fresh = q.claim_one("w1")
    assert fresh.job.id == stale.job.id
    before = store.get_job(stale.job.id)
    assert OPERATIONS[op](stale) is False
    assert store.get_job(stale.job.id) == before
    assert dead_count() == 0
    assert fresh.ack() is True


@pytest.mark.parametrize("spend", ["ack", "retry_with_delay", "fail", "release"])
@pytest.mark.parametrize("op", OPERATIONS)
def test_handle__refuses_every_operation_once_spent(spend, op):
    # Inside the test's transaction the handle is not marked spent yet (that
    # happens on commit): the database's fence is what refuses here.
    _, handle = claimed(max_attempts=5)
    assert OPERATIONS[spend](handle) is True
    before_live, before_dead = live_count(), dead_count()
    before = store.get_job(handle.job.id)
    assert OPERATIONS[op](handle) is False
    assert store.get_job(handle.job.id) == before
    assert (live_count(), dead_count()) == (before_live, before_dead)


def test_handle__released_then_reclaimed_refuses_the_old_handle_even_with_the_same_attempt():
    q, first = claimed()
    first.release()
    second = q.claim_one("w1")
    # Same worker id and the same attempt number: the claim generation refuses.
    assert (second.job.attempts, second.job.worker_id) == (first.job.attempts, "w1")
    assert first.ack() is False
    assert store.get_job(first.job.id).state == "processing"


@pytest.mark.parametrize("op", OPERATIONS)
def test_handle__refuses_every_operation_after_cancel(op):
    q, handle = claimed()
    assert q.cancel(handle.job.id) is True
    assert OPERATIONS[op](handle) is False
    assert (live_count(), dead_count()) == (0, 0)


def retry_delays(n, **opts):
    """Claim n jobs, retry each over the real path, return each run_at - db now (s)."""
    q = store.queue("backoff", max_attempts=10, **opts)
    q.enqueue_many([{}] * n)
    handles = q.claim_batch("w", n)
    assert len(handles) == n
    return [retried_delay(handle) for handle in handles]


def retried_delay(handle):
    """Retry over the real path; return the whole seconds until the job is due again."""
    assert handle.retry("again") is True
    # Read right after the retry: the few milliseconds between the two
    # statements vanish in the rounding (delays are whole seconds).
    left = (store.get_job(handle.job.id).run_at - db_now()).total_seconds()
    return round(left + 0.25)


def test_backoff__first_retry_spreads_uniformly_over_half_to_full_base():
    delays = retry_delays(200, retry_base_s=16)
    # d = 16: every integer in [8, 16] is possible and nothing outside it.
    assert min(delays) >= 8 and max(delays) <= 16
    assert set(delays) == set(range(8, 17))


def test_backoff__doubles_with_each_attempt():
    q = store.queue("backoff", max_attempts=10, retry_base_s=4)
    q.enqueue_many([{}] * 60)
    for _ in range(2):
        for handle in q.claim_batch("w", 60):
            handle.retry(delay_s=0)
    handles = q.claim_batch("w", 60)
    assert {h.job.attempts for h in handles} == {3}
    delays = [retried_delay(handle) for handle in handles]
    # attempt 3, base 4: d = 16 -> [8, 16]
    assert min(delays) >= 8 and max(delays) <= 16
    assert len(set(delays)) >= 5


def test_backoff__is_capped_at_an_hour():
    delays = retry_delays(60, retry_base_s=10_000)
    assert min(delays) >= 1800 and max(delays) <= 3600
    assert max(delays) > 3000


def test_backoff__retried_job_is_not_claimable_before_its_delay():
    q = store.queue("backoff", retry_base_s=5)
    q.enqueue({})
    handle = q.claim_one("w")
    handle.retry()
    assert q.claim_one("w") is None
    make_due(handle.job.id)
    assert q.claim_one("w").job.attempts == 2


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_stale_handle__after_bury_requeue_and_reclaim_by_the_same_worker_changes_nothing(
    operation,
):
    """A requeue resets attempts; the claim generation a handle is fenced by never goes back."""
    from alkstore_django import operations

    q, old = claimed(max_attempts=1)
    lapse_claim(old.job.id)
    assert q.claim_one("w2") is None  # the exhausted lapsed claim is buried first
    assert store.get_job(old.job.id).state == "dead"
    assert operations.requeue_dead([old.job.id]) == 1
    new = q.claim_one("w1")
    assert (new.job.id, new.job.attempts, new.job.worker_id) == (old.job.id, 1, "w1")
    assert new.job.generation > old.job.generation

    assert OPERATIONS[operation](old) is False
    job = store.get_job(new.job.id)
    assert (job.state, job.attempts, job.worker_id) == ("processing", 1, "w1")
    assert job.claim_expires_at == new.job.claim_expires_at
    assert new.ack() is True


@pytest.mark.django_db(transaction=True)
def test_handle__is_spent_when_its_operation_commits_not_when_it_rolls_back():
    from django.db import transaction

    _, handle = claimed()
    with pytest.raises(RuntimeError), transaction.atomic(using=ALKSTORE_DB):
        assert handle.retry("boom", delay_s=0) is True
        raise RuntimeError("the caller's transaction rolls back")
    assert handle.spent is False
    assert store.get_job(handle.job.id).state == "processing"
    with transaction.atomic(using=ALKSTORE_DB):
        assert handle.ack() is True
        assert handle.spent is False  # the transaction has not committed yet
    assert handle.spent is True
    assert handle.ack() is False
    assert store.get_job(handle.job.id) is None
