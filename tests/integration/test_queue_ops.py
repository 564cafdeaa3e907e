"""Queue-level operations: ack_batch, cancel, sweep_expired, stats, get_job."""

from __future__ import annotations

import pytest

from alkstore_django import store
from alkstore_django.records import SweepResult
from tests.helpers import age_dead, dead_count, expire_job, lapse_claim, live_count

pytestmark = pytest.mark.django_db

TEN_YEARS_S = 10 * 365 * 86_400


def test_ack_batch__counts_only_ids_under_an_unexpired_claim():
    q = store.queue("batch")
    q.enqueue_many(range(4))
    valid_a, valid_b, lapsed = q.claim_batch("w", 3)
    pending = q.enqueue("still pending")
    other_queue = store.queue("other")
    other_queue.enqueue({})
    foreign = other_queue.claim_one("w")
    lapse_claim(lapsed.job.id)
    ids = [valid_a.job.id, lapsed.job.id, 987_654_321, pending, foreign.job.id, valid_b.job.id]
    assert q.ack_batch(ids) == 2
    assert store.get_job(valid_a.job.id) is None and store.get_job(valid_b.job.id) is None
    assert store.get_job(lapsed.job.id).state == "processing"
    assert store.get_job(pending).state == "pending"
    assert store.get_job(foreign.job.id).state == "processing"


def test_ack_batch__ignores_the_worker_that_claimed():
    q = store.queue("batch")
    q.enqueue_many([1, 2])
    a = q.claim_one("w1")
    b = q.claim_one("w2")
    assert q.ack_batch([a.job.id, b.job.id]) == 2
    assert live_count("batch") == 0


def test_ack_batch__of_nothing_or_repeated_ids_counts_each_row_once():
    q = store.queue("batch")
    q.enqueue({})
    handle = q.claim_one("w")
    assert q.ack_batch([]) == 0
    assert q.ack_batch([handle.job.id, handle.job.id]) == 1
    assert q.ack_batch([handle.job.id]) == 0


def test_cancel__deletes_a_pending_job():
    q = store.queue("cancel")
    job_id = q.enqueue({})
    assert q.cancel(job_id) is True
    assert store.get_job(job_id) is None
    assert dead_count() == 0


def test_cancel__deletes_a_processing_job_and_its_handle_then_finds_nothing():
    q = store.queue("cancel")
    job_id = q.enqueue({})
    handle = q.claim_one("w")
    assert q.cancel(job_id) is True
    assert store.get_job(job_id) is None
    assert handle.ack() is False


def test_cancel__returns_false_when_there_is_no_such_live_job():
    q = store.queue("cancel")
    assert q.cancel(123_456_789) is False
    job_id = q.enqueue({})
    assert q.cancel(job_id) is True
    assert q.cancel(job_id) is False


def test_cancel__does_not_touch_another_queues_job_or_a_dead_letter():
    q = store.queue("cancel")
    other_id = store.queue("other").enqueue({})
    assert q.cancel(other_id) is False
    assert store.get_job(other_id).state == "pending"
    q.enqueue({})
    dead = q.claim_one("w")
    dead.fail()
    assert q.cancel(dead.job.id) is False
    assert store.get_job(dead.job.id).state == "dead"


def test_sweep_expired__dead_letters_expired_pending_and_processing_rows():
    q = store.queue("sweep")
    pending = q.enqueue("p", expires_s=60)
    claimed_id = q.enqueue("c", expires_s=60)
    fresh = q.enqueue("f", expires_s=60)
    forever = q.enqueue("n")
    handle = q.claim_batch("w", 2)[1]
    assert handle.job.id == claimed_id
    expire_job(pending)
    expire_job(claimed_id)
    assert q.sweep_expired() == SweepResult(expired=2, purged=0)
    for job_id in (pending, claimed_id):
        dead = store.get_job(job_id)
        assert (dead.state, dead.last_error) == ("dead", "expired")
    assert store.get_job(fresh).state == "pending"
    assert store.get_job(forever).state == "pending"
    assert handle.ack() is False


def test_sweep_expired__touches_only_its_own_queue():
    mine, other = store.queue("sweep"), store.queue("other")
    other_id = other.enqueue({}, expires_s=60)
    expire_job(other_id)
    assert mine.sweep_expired() == SweepResult(expired=0, purged=0)
    assert store.get_job(other_id).state == "pending"


def bury(q, n):
    q.enqueue_many(range(n))
    handles = q.claim_batch("w", n)
    for handle in handles:
        handle.fail("done for")
    return [h.job.id for h in handles]


def test_sweep_expired__purges_dead_letters_older_than_retention():
    q = store.queue("retention", dead_letter_retention_s=3600)
    old, young = bury(q, 2)
    age_dead(old, 3601)
    age_dead(young, 3500)
    assert q.sweep_expired() == SweepResult(expired=0, purged=1)
    assert store.get_job(old) is None
    assert store.get_job(young).state == "dead"


def test_sweep_expired__keeps_dead_letters_seven_days_by_default():
    q = store.queue("retention")
    old, young = bury(q, 2)
    age_dead(old, 7 * 86_400 + 5)
    age_dead(young, 7 * 86_400 - 60)
    assert q.sweep_expired().purged == 1
    assert store.get_job(young) is not None


def test_sweep_expired__retention_none_keeps_dead_letters_forever():
    q = store.queue("retention", dead_letter_retention_s=None)
    (old,) = bury(q, 1)
    age_dead(old, TEN_YEARS_S)
    assert q.sweep_expired() == SweepResult(expired=0, purged=0)
    assert store.get_job(old).state == "dead"


def test_sweep_expired__purges_only_its_own_queues_dead_letters():
    q = store.queue("retention", dead_letter_retention_s=60)
    (other_dead,) = bury(store.queue("other"), 1)
    age_dead(other_dead, TEN_YEARS_S)
    assert q.sweep_expired().purged == 0
    assert store.get_job(other_dead) is not None


def test_stats__counts_each_state_against_the_database_clock():
    q = store.queue("stats", dead_letter_retention_s=None)
    assert q.stats().pending == 0 and q.stats().oldest_pending_age_s is None
    q.enqueue_many(range(3))
    q.enqueue("later", delay_s=600)
    q.claim_one("w")
    q.enqueue("to die")
    q.claim_batch("w", 2)[1].fail()
    stats = q.stats()
    assert (stats.pending, stats.scheduled, stats.processing, stats.dead) == (1, 1, 2, 1)
    assert stats.queue == "stats"
    assert 0 <= stats.oldest_pending_age_s < 30


def test_stats__counts_lapsed_claims_as_overdue():
    q = store.queue("stats")
    q.enqueue({})
    handle = q.claim_one("w")
    lapse_claim(handle.job.id, seconds_ago=5)
    stats = q.stats()
    assert (stats.processing, stats.overdue) == (1, 1)


def test_get_job__returns_none_for_an_unknown_id():
    assert store.get_job(424_242) is None


def test_get_job__sees_a_dead_letter_with_its_death_stamp():
    q = store.queue("dead")
    job_id = q.enqueue({"k": [1, "two"]})
    q.claim_one("w").fail("nope")
    dead = store.get_job(job_id)
    assert dead.state == "dead" and dead.id == job_id
    assert dead.died_at >= dead.enqueued_at
    assert dead.payload == {"k": [1, "two"]} and dead.last_error == "nope"
    assert live_count() == 0 and dead_count() == 1
