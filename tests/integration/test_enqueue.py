"""Enqueue: resolved stamps, one clock read, delay over run_at, transactions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connections, transaction
from django.db.transaction import TransactionManagementError
from django.test import override_settings

from alkstore_django import store
from alkstore_django.errors import InvalidArgument
from alkstore_django.models import Job
from tests.helpers import ALKSTORE_DB, ROUTING, db_now, live_count, site_database
from tests.testapp.models import Order

pytestmark = pytest.mark.django_db


def test_enqueue__returns_increasing_ids_and_the_payload_round_trips():
    payloads = [{"a": 1, "nested": [1, 2.5, None, True]}, "text", 7, None, ["é", {"k": "v"}]]
    q = store.queue("roundtrip")
    ids = [q.enqueue(p) for p in payloads]
    assert ids == sorted(ids)
    assert [store.get_job(i).payload for i in ids] == payloads


@pytest.mark.django_db(transaction=True)
def test_enqueue__writes_again_after_the_connection_was_closed():
    # PostgreSQL keeps a cursor per thread and connection: a reconnect must not
    # reuse the one bound to the closed connection.
    q = store.queue("reconnect")
    first = q.enqueue(1)
    connections[store.using].close()
    second = q.enqueue(2)
    assert second > first
    assert [store.get_job(i).payload for i in (first, second)] == [1, 2]


def test_enqueue_many__returns_ids_in_payload_order_with_every_payload_equal():
    payloads = [{"n": n} for n in range(25)]
    ids = store.queue("many").enqueue_many(payloads)
    assert ids == sorted(ids) and len(set(ids)) == 25
    assert [store.get_job(i).payload for i in ids] == payloads


def test_enqueue_many__of_nothing_writes_nothing():
    assert store.queue("many").enqueue_many([]) == []
    assert live_count() == 0


def test_enqueue__without_delay_stamps_run_at_equal_to_enqueued_at():
    job = store.get_job(store.queue("clock").enqueue({}))
    assert job.run_at == job.enqueued_at
    assert job.state == "pending" and job.attempts == 0 and job.worker_id is None


def test_enqueue__reads_the_clock_once_for_delay_and_expiry():
    job = store.get_job(store.queue("clock").enqueue({}, delay_s=10, expires_s=60))
    assert job.run_at - job.enqueued_at == timedelta(seconds=10)
    assert job.expires_at - job.enqueued_at == timedelta(seconds=60)


def test_enqueue__expiry_is_relative_to_the_clock_read_not_to_run_at():
    job = store.get_job(store.queue("clock").enqueue({}, expires_s=60))
    assert job.expires_at - job.run_at == timedelta(seconds=60)


def test_enqueue__uses_the_database_clock_for_enqueued_at():
    before = db_now()
    job = store.get_job(store.queue("clock").enqueue({}))
    after = db_now()
    assert (
        before - timedelta(milliseconds=2) <= job.enqueued_at <= after + timedelta(milliseconds=2)
    )


def test_enqueue__delay_s_wins_over_run_at():
    far = datetime(2099, 1, 1, tzinfo=UTC)
    job = store.get_job(store.queue("clock").enqueue({}, delay_s=0, run_at=far))
    assert job.run_at == job.enqueued_at


def test_enqueue__run_at_is_stored_as_given():
    at = datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    job = store.get_job(store.queue("clock").enqueue({}, run_at=at))
    assert job.run_at == at


def test_enqueue__run_at_in_another_zone_is_the_same_instant():
    at = datetime(2031, 5, 6, 9, 8, 9, tzinfo=UTC).astimezone(datetime.now(UTC).astimezone().tzinfo)
    job = store.get_job(store.queue("clock").enqueue({}, run_at=at))
    assert job.run_at == at


def test_job_record__shows_the_resolved_stamps_of_the_handle():
    q = store.queue(
        "stamped",
        visibility_timeout_s=42,
        max_attempts=7,
        retry_base_s=3,
        priority=5,
        expires_s=100,
    )
    job = store.get_job(q.enqueue({"x": 1}))
    assert (job.visibility_timeout_s, job.max_attempts, job.retry_base_s, job.priority) == (
        42,
        7,
        3,
        5,
    )
    assert job.expires_at - job.enqueued_at == timedelta(seconds=100)
    assert job.queue == "stamped" and job.died_at is None


def test_job_record__engine_defaults_for_a_plain_queue():
    job = store.get_job(store.queue("plain").enqueue({}))
    assert (job.visibility_timeout_s, job.max_attempts, job.retry_base_s, job.priority) == (
        300,
        3,
        5,
        0,
    )
    assert job.expires_at is None


def test_enqueue__max_attempts_and_priority_override_one_job_only():
    q = store.queue("override", max_attempts=4, priority=1)
    special = store.get_job(q.enqueue({}, max_attempts=9, priority=-3))
    normal = store.get_job(q.enqueue({}))
    assert (special.max_attempts, special.priority) == (9, -3)
    assert (normal.max_attempts, normal.priority) == (4, 1)


@override_settings(
    ALKSTORE={**ROUTING, "QUEUES": {"emails": {"visibility_timeout_s": 30, "max_attempts": 5}}}
)
def test_queue__derives_its_defaults_from_the_queues_setting():
    emails = store.get_job(store.queue("emails").enqueue({}))
    other = store.get_job(store.queue("other").enqueue({}))
    assert (emails.visibility_timeout_s, emails.max_attempts, emails.retry_base_s) == (30, 5, 5)
    assert (other.visibility_timeout_s, other.max_attempts) == (300, 3)


@override_settings(ALKSTORE={**ROUTING, "QUEUES": {"emails": {"visibility_timeout_s": 30}}})
def test_queue__handle_opts_win_over_derived_defaults():
    job = store.get_job(store.queue("emails", visibility_timeout_s=90).enqueue({}))
    assert job.visibility_timeout_s == 90


def test_queue__opts_are_resolved_once_at_construction():
    q = store.queue("once")
    with override_settings(ALKSTORE={**ROUTING, "QUEUES": {"once": {"max_attempts": 8}}}):
        job = store.get_job(q.enqueue({}))
    assert job.max_attempts == 3


def test_enqueue__rollback_drops_the_job():
    q = store.queue("tx")
    with pytest.raises(RuntimeError), transaction.atomic(using=ALKSTORE_DB):
        job_id = q.enqueue({"n": 1})
        assert store.get_job(job_id) is not None
        raise RuntimeError("business write failed")
    assert store.get_job(job_id) is None
    assert live_count("tx") == 0


def test_enqueue__in_an_atomic_block_marked_for_rollback__is_refused_as_django_refuses_queries():
    # An exception out of an inner atomic(savepoint=False) leaves the whole
    # block to roll back: Django refuses every query until its end, and so
    # must the enqueues that bypass Django's cursor (prepared, kept).
    q = store.queue("tx")
    with transaction.atomic(using=ALKSTORE_DB):
        with pytest.raises(RuntimeError), transaction.atomic(using=ALKSTORE_DB, savepoint=False):
            raise RuntimeError("business write failed")
        with pytest.raises(TransactionManagementError, match="atomic"):
            q.enqueue({"n": 1})
    assert live_count("tx") == 0


@site_database("the job commits with a site row")
def test_enqueue__inside_atomic_commits_or_rolls_back_with_the_business_write():
    q = store.queue("tx")
    with pytest.raises(RuntimeError), transaction.atomic(using=ALKSTORE_DB):
        Order.objects.create(reference="lost")
        q.enqueue({"order": "lost"})
        raise RuntimeError("abort")
    with transaction.atomic(using=ALKSTORE_DB):
        Order.objects.create(reference="kept")
        kept = q.enqueue({"order": "kept"})
    assert list(Order.objects.values_list("reference", flat=True)) == ["kept"]
    assert list(Job.objects.filter(queue="tx").values_list("id", flat=True)) == [kept]


def test_enqueue_many__rollback_of_a_savepoint_drops_only_its_jobs():
    q = store.queue("tx")
    with transaction.atomic(using=ALKSTORE_DB):
        first = q.enqueue_many([1, 2])
        with pytest.raises(RuntimeError), transaction.atomic(using=ALKSTORE_DB):
            q.enqueue_many([3, 4])
            raise RuntimeError("inner")
    assert sorted(Job.objects.filter(queue="tx").values_list("id", flat=True)) == first


def test_enqueue_many__splits_a_huge_batch_and_keeps_every_id_in_order():
    ids = store.queue("huge").enqueue_many([{"n": n} for n in range(10_001)])
    assert len(ids) == len(set(ids)) == 10_001 and ids == sorted(ids)
    assert live_count("huge") == 10_001
    assert store.get_job(ids[-1]).payload == {"n": 10_000}


@pytest.mark.django_db(transaction=True)
def test_enqueue_many__a_failure_in_a_later_chunk_writes_nothing(monkeypatch):
    dialect_class = type(store.dialect)
    original = dialect_class.enqueue
    calls = []

    def second_chunk_fails(self, stamps, payloads):
        calls.append(len(payloads))
        if len(calls) == 2:
            raise RuntimeError("connection lost mid-batch")
        return original(self, stamps, payloads)

    monkeypatch.setattr(dialect_class, "enqueue", second_chunk_fails)
    with pytest.raises(RuntimeError, match="mid-batch"):
        store.queue("huge").enqueue_many([{"n": n} for n in range(10_005)])
    assert calls == [10_000, 5]
    assert live_count() == 0


def test_enqueue__accepts_the_extremes_of_every_range():
    from alkstore_django.validation import MAX_DURATION_S

    q = store.queue("edges", visibility_timeout_s=MAX_DURATION_S, retry_base_s=0)
    job = store.get_job(
        q.enqueue({}, delay_s=MAX_DURATION_S, priority=-(2**31), max_attempts=2**31 - 1)
    )
    assert job.run_at - job.enqueued_at == timedelta(seconds=MAX_DURATION_S)
    assert (job.priority, job.max_attempts) == (-(2**31), 2**31 - 1)
    top = store.get_job(q.enqueue({}, priority=2**31 - 1))
    assert top.priority == 2**31 - 1
    assert q.claim_one("w").job.id == top.id


def test_timeout_s__is_stored_with_the_job_from_the_call_or_the_queue(settings):
    settings.ALKSTORE = {**ROUTING, "QUEUES": {"limited": {"timeout_s": 30}}}
    assert store.get_job(store.queue("limited").enqueue(1)).timeout_s == 30
    assert store.get_job(store.queue("limited").enqueue(1, timeout_s=2.5)).timeout_s == 2.5
    assert store.get_job(store.queue("free").enqueue(1)).timeout_s is None


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "30", True])
def test_timeout_s__out_of_range_is_refused_before_any_write(bad):
    with pytest.raises(InvalidArgument, match="Invalid timeout_s"):
        store.queue("free").enqueue(1, timeout_s=bad)
    with pytest.raises(InvalidArgument, match="Invalid timeout_s"):
        store.queue("free", timeout_s=bad)
    assert live_count() == 0
