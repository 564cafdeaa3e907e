"""Claims: eligibility, order, attempts, deadlines, the pre-claim sweep, the clock."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from alkstore_django import store
from tests.helpers import (
    db_now,
    dead_count,
    expire_job,
    lapse_claim,
    live_count,
    make_due,
    postgres_only,
)

pytestmark = pytest.mark.django_db


def test_claim_one__returns_none_on_an_empty_queue():
    assert store.queue("empty").claim_one("w1") is None


def test_claim_one__marks_the_row_processing_for_the_worker():
    q = store.queue("claims")
    job_id = q.enqueue({"x": 1})
    handle = q.claim_one("w1")
    assert handle.job.id == job_id and handle.job.payload == {"x": 1}
    stored = store.get_job(job_id)
    assert (stored.state, stored.worker_id, stored.attempts) == ("processing", "w1", 1)
    assert handle.job == stored


def test_claim_batch__orders_by_priority_desc_then_run_at_then_id():
    q = store.queue("order")
    base = datetime(2020, 1, 1, tzinfo=UTC)
    late_low = q.enqueue("late-low", run_at=base + timedelta(seconds=5), priority=0)
    early_low_a = q.enqueue("early-low-a", run_at=base, priority=0)
    early_low_b = q.enqueue("early-low-b", run_at=base, priority=0)
    high_late = q.enqueue("high-late", run_at=base + timedelta(seconds=9), priority=10)
    high_early = q.enqueue("high-early", run_at=base + timedelta(seconds=1), priority=10)
    negative = q.enqueue("negative", run_at=base - timedelta(days=1), priority=-5)
    handles = q.claim_batch("w1", 10)
    assert [h.job.id for h in handles] == [
        high_early,
        high_late,
        early_low_a,
        early_low_b,
        late_low,
        negative,
    ]


def test_claim_one__takes_jobs_one_by_one_in_the_same_order():
    q = store.queue("order")
    ids = [q.enqueue(n, priority=n % 3) for n in range(9)]
    expected = sorted(ids, key=lambda i: (-(ids.index(i) % 3), i))
    assert [q.claim_one("w").job.id for _ in ids] == expected
    assert q.claim_one("w") is None


def test_claim_batch__n_zero_or_negative_returns_empty_and_claims_nothing():
    q = store.queue("claims")
    q.enqueue({})
    assert q.claim_batch("w", 0) == []
    assert q.claim_batch("w", -3) == []
    assert store.get_job(q.claim_one("w").job.id).attempts == 1


def test_claim_batch__never_returns_more_than_n():
    q = store.queue("claims")
    q.enqueue_many(range(5))
    assert len(q.claim_batch("w", 3)) == 3
    assert len(q.claim_batch("w", 3)) == 2


def test_claim__ignores_other_queues():
    store.queue("a").enqueue({})
    assert store.queue("b").claim_one("w") is None


def test_claim__skips_delayed_jobs_until_they_are_due():
    q = store.queue("delayed")
    job_id = q.enqueue({}, delay_s=60)
    assert q.claim_one("w") is None
    make_due(job_id)
    assert q.claim_one("w").job.id == job_id


def test_claim__skips_expired_pending_jobs():
    q = store.queue("expiring")
    job_id = q.enqueue({}, expires_s=60)
    expire_job(job_id)
    assert q.claim_one("w") is None
    assert store.get_job(job_id).state == "pending"


def test_claim__sets_the_deadline_from_the_rows_own_visibility_stamp():
    job_id = store.queue("vt", visibility_timeout_s=30).enqueue({})
    handle = store.queue("vt", visibility_timeout_s=900).claim_one("w")
    assert handle.job.id == job_id
    left = (handle.job.claim_expires_at - db_now()).total_seconds()
    assert 28 < left <= 30


def test_claim__does_not_take_a_live_claim():
    q = store.queue("live")
    q.enqueue({})
    assert q.claim_one("w1") is not None
    assert q.claim_one("w2") is None


def test_reclaim__of_a_lapsed_claim_consumes_an_attempt():
    q = store.queue("reclaim", max_attempts=3)
    job_id = q.enqueue({})
    first = q.claim_one("w1")
    lapse_claim(job_id)
    second = q.claim_one("w2")
    assert second.job.id == job_id
    assert (first.job.attempts, second.job.attempts) == (1, 2)
    assert store.get_job(job_id).worker_id == "w2"


def test_reclaim__keeps_the_lapsed_job_in_its_order():
    q = store.queue("reclaim")
    first = q.enqueue("first")
    q.enqueue("second")
    q.claim_one("w1")
    lapse_claim(first)
    assert q.claim_one("w2").job.id == first


def test_pre_claim_sweep__dead_letters_an_exhausted_lapsed_claim():
    q = store.queue("exhausted", max_attempts=1)
    job_id = q.enqueue({"p": 1})
    q.claim_one("w1")
    lapse_claim(job_id)
    assert q.claim_one("w2") is None
    dead = store.get_job(job_id)
    assert (dead.state, dead.last_error, dead.attempts) == ("dead", "max attempts exceeded", 1)
    assert dead.payload == {"p": 1} and dead.died_at is not None
    assert live_count("exhausted") == 0


@postgres_only("SQLite and MariaDB move lapsed claims inside the claim's own transaction")
@pytest.mark.django_db(transaction=True)
def test_claim__hands_out_its_jobs_when_moving_the_lapsed_claims_after_it_fails(
    monkeypatch, caplog
):
    # PostgreSQL's claim commits before the lapsed claims it left are moved.
    # Raised from the claim, a failure of that move would keep the jobs it
    # claimed from the worker: each would lapse and be charged an attempt.
    q = store.queue("moves")
    left = q.enqueue("left")
    q.claim_one("w1")
    lapse_claim(left)
    wanted = q.enqueue("wanted", priority=5)
    monkeypatch.setattr(store.dialect, "_move_lapsed_sql", "SELECT 1 / 0 FROM (SELECT %s) AS q")
    acked, jobs = store.dialect.claim_and_ack("moves", "w2", 1, "w2", [])
    assert (acked, [job.id for job in jobs]) == ([], [wanted])
    assert "could not move the lapsed claims of queue moves" in caplog.text
    stored = store.get_job(left)
    assert (stored.state, stored.worker_id, stored.attempts) == ("processing", "w1", 1)
    monkeypatch.undo()
    # Left lapsed, as before the claim: the next claim takes it.
    assert q.claim_one("w3").job.id == left


def test_pre_claim_sweep__runs_even_when_another_job_is_claimed():
    q = store.queue("exhausted", max_attempts=2)
    job_id = q.enqueue("dies")
    q.claim_one("w1")
    lapse_claim(job_id)
    assert q.claim_one("w2").job.id == job_id
    lapse_claim(job_id)
    other = q.enqueue("lives")
    assert q.claim_one("w3").job.id == other
    assert store.get_job(job_id).last_error == "max attempts exceeded"


def test_pre_claim_sweep__leaves_live_claims_and_other_queues_alone():
    q = store.queue("exhausted", max_attempts=1)
    live_id = q.enqueue("live")
    q.claim_one("w1")
    other = store.queue("elsewhere", max_attempts=1)
    lapsed_id = other.enqueue("lapsed")
    other.claim_one("w1")
    lapse_claim(lapsed_id)
    assert q.claim_one("w2") is None
    assert store.get_job(live_id).state == "processing"
    assert store.get_job(lapsed_id).state == "processing"
    assert dead_count() == 0


def test_claim__with_the_app_clock_a_day_ahead_neither_claims_early_nor_steals(monkeypatch):
    q = store.queue("skew", visibility_timeout_s=300)
    delayed = q.enqueue("delayed", delay_s=60)
    live = q.enqueue("live")
    assert q.claim_one("honest").job.id == live
    real_now, real_time = timezone.now, time.time
    monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(days=1))
    monkeypatch.setattr(time, "time", lambda: real_time() + 86_400)
    assert q.claim_one("skewed") is None
    assert store.get_job(live).worker_id == "honest"
    assert store.get_job(delayed).state == "pending"


def test_claim__with_the_app_clock_a_day_behind_still_claims_due_jobs(monkeypatch):
    q = store.queue("skew")
    job_id = q.enqueue("due")
    real_now, real_time = timezone.now, time.time
    monkeypatch.setattr(timezone, "now", lambda: real_now() - timedelta(days=1))
    monkeypatch.setattr(time, "time", lambda: real_time() - 86_400)
    assert q.claim_one("behind").job.id == job_id


def test_reclaim__lapsed_rows_beyond_n_wait_as_pending_with_their_attempts():
    q = store.queue("reclaim", max_attempts=5)
    ids = q.enqueue_many(["a", "b", "c"])
    stale = q.claim_batch("w1", 3)
    for job_id in ids:
        lapse_claim(job_id)
    first = q.claim_one("w2")
    assert (first.job.id, first.job.attempts) == (ids[0], 2)
    rest = [store.get_job(job_id) for job_id in ids[1:]]
    assert all(job.state != "processing" or job.worker_id == "w1" for job in rest)
    assert all(h.ack() is False for h in stale)
    again = q.claim_batch("w3", 5)
    assert [(h.job.id, h.job.attempts) for h in again] == [(ids[1], 2), (ids[2], 2)]


def test_reclaim__a_lapsed_row_that_also_expired_is_not_claimed():
    q = store.queue("reclaim")
    job_id = q.enqueue({}, expires_s=60)
    q.claim_one("w1")
    lapse_claim(job_id)
    expire_job(job_id)
    assert q.claim_one("w2") is None
    assert q.sweep_expired().expired == 1
    assert store.get_job(job_id).last_error == "expired"
