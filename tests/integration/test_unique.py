"""Unique jobs: at most one live job per (queue, key), enforced by the database."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import IntegrityError, transaction
from django.db.models.functions import Now

from alkstore_django import store
from alkstore_django.errors import DuplicateJob, InvalidArgument
from alkstore_django.models import DeadJob, Job, UniqueWindow
from alkstore_django.operations import requeue_dead
from tests.helpers import ALKSTORE_DB, db_now, expire_job, live_count

pytestmark = pytest.mark.django_db(transaction=True)


def end_window(job_id: int) -> None:
    """Let a job's unique_for_s window run out now."""
    UniqueWindow.objects.filter(job_id=job_id).update(held_until=Now() - timedelta(seconds=1))


def test_enqueue__a_taken_key_returns_the_live_holders_id_and_writes_nothing():
    q = store.queue("u")
    first = q.enqueue({"n": 1}, unique_key="order:42")
    assert q.enqueue({"n": 2}, unique_key="order:42") == first
    assert live_count("u") == 1
    assert store.get_job(first).payload == {"n": 1}
    assert store.get_job(first).unique_key == "order:42"


def test_enqueue__the_same_key_on_another_queue_or_no_key_is_independent():
    first = store.queue("u").enqueue({}, unique_key="k")
    other = store.queue("u2").enqueue({}, unique_key="k")
    plain = store.queue("u").enqueue({})
    assert len({first, other, plain}) == 3


def test_enqueue__on_duplicate_raise__names_the_holder():
    q = store.queue("u")
    first = q.enqueue({}, unique_key="k")
    with pytest.raises(DuplicateJob, match=rf"'k' of queue 'u' is held by job {first}") as info:
        q.enqueue({}, unique_key="k", on_duplicate="raise")
    assert info.value.job_id == first
    assert live_count("u") == 1


def test_the_key_frees_on_ack():
    q = store.queue("u")
    first = q.enqueue({}, unique_key="k")
    assert q.claim_one("w").ack()
    second = q.enqueue({}, unique_key="k")
    assert second != first
    assert live_count("u") == 1


def test_the_key_stays_taken_while_processing():
    q = store.queue("u")
    first = q.enqueue({}, unique_key="k")
    assert q.claim_one("w").job.id == first
    assert q.enqueue({}, unique_key="k") == first


def test_the_key_frees_on_dead_letter():
    q = store.queue("u")
    first = q.enqueue({}, unique_key="k")
    assert q.claim_one("w").fail("boom")
    assert DeadJob.objects.get(id=first).unique_key == "k"
    second = q.enqueue({}, unique_key="k")
    assert second != first


def test_the_key_frees_on_expiry_and_on_cancel():
    q = store.queue("u")
    first = q.enqueue({}, unique_key="k", unique_for_s=3600)
    expire_job(first)
    assert q.sweep_expired().expired == 1
    second = q.enqueue({}, unique_key="k", unique_for_s=3600)
    assert second != first
    assert q.cancel(second)
    assert q.enqueue({}, unique_key="k") not in (first, second)


def test_the_key_frees_when_the_enqueuing_transaction_rolls_back():
    q = store.queue("u")
    with pytest.raises(RuntimeError), transaction.atomic(using=ALKSTORE_DB):
        q.enqueue({}, unique_key="k", unique_for_s=3600)
        raise RuntimeError("rolled back")
    assert live_count("u") == 0
    assert not UniqueWindow.objects.exists()
    job_id = q.enqueue({}, unique_key="k")
    assert store.get_job(job_id).unique_key == "k"


def test_on_duplicate_raise_inside_a_transaction__leaves_the_callers_writes():
    q = store.queue("u")
    q.enqueue({}, unique_key="k")
    with transaction.atomic(using=ALKSTORE_DB):
        mine = q.enqueue({}, unique_key="mine")
        with pytest.raises(DuplicateJob):
            q.enqueue({}, unique_key="k", on_duplicate="raise")
    assert store.get_job(mine) is not None


def test_unique_for_s__holds_the_key_after_success_until_the_window_ends():
    q = store.queue("u")
    first = q.enqueue({}, unique_key="k", unique_for_s=3600)
    assert q.claim_one("w").ack()
    assert store.get_job(first) is None
    # Taken for every newcomer, with a window of its own or not.
    assert q.enqueue({}, unique_key="k") == first
    assert q.enqueue({}, unique_key="k", unique_for_s=5) == first
    with pytest.raises(DuplicateJob) as info:
        q.enqueue({}, unique_key="k", on_duplicate="raise")
    assert info.value.job_id == first
    assert live_count("u") == 0
    end_window(first)
    second = q.enqueue({}, unique_key="k", unique_for_s=3600)
    assert second != first
    assert list(UniqueWindow.objects.values_list("job_id", flat=True)) == [second]


def test_unique_for_s__a_dead_lettered_job_frees_its_window():
    q = store.queue("u")
    first = q.enqueue({}, unique_key="k", unique_for_s=3600)
    assert q.claim_one("w").fail()
    assert q.enqueue({}, unique_key="k") != first


def test_unique_for_s__the_window_is_measured_from_enqueue_by_the_database_clock():
    first = store.queue("u").enqueue({}, unique_key="k", unique_for_s=90)
    window = UniqueWindow.objects.get(job_id=first)
    enqueued_at = Job.objects.get(id=first).enqueued_at
    assert abs((window.held_until - enqueued_at).total_seconds() - 90) < 0.01


def test_the_sweep__deletes_expired_windows():
    q = store.queue("u")
    first = q.enqueue({}, unique_key="k", unique_for_s=3600)
    kept = q.enqueue({}, unique_key="j", unique_for_s=3600)
    end_window(first)
    q.sweep_expired()
    assert list(UniqueWindow.objects.values_list("job_id", flat=True)) == [kept]


def test_enqueue_many__maps_each_payload_to_its_job_or_its_keys_holder():
    q = store.queue("u")
    held = q.enqueue({"n": 0}, unique_key="a")
    ids = q.enqueue_many([{"n": 1}, {"n": 2}, {"n": 3}, {"n": 4}], unique_keys=["a", "b", "c", "b"])
    assert ids[0] == held
    assert ids[1] == ids[3]
    assert len({held, ids[1], ids[2]}) == 3
    assert store.get_job(ids[1]).payload == {"n": 2}
    assert live_count("u") == 3


def test_enqueue_many__on_duplicate_raise_writes_nothing_at_all():
    q = store.queue("u")
    held = q.enqueue({}, unique_key="b")
    with pytest.raises(DuplicateJob) as info:
        q.enqueue_many([1, 2, 3], unique_keys=["a", "b", "c"], on_duplicate="raise")
    assert info.value.job_id == held
    with pytest.raises(DuplicateJob, match="appears twice in the batch"):
        q.enqueue_many([1, 2], unique_keys=["x", "x"], on_duplicate="raise")
    assert live_count("u") == 1


def test_the_index_refuses_a_second_live_row_with_the_key_whatever_writes_it():
    q = store.queue("u")
    job_id = q.enqueue({}, unique_key="k")
    row = Job.objects.get(id=job_id)
    row.pk = None
    with pytest.raises(IntegrityError), transaction.atomic(using=ALKSTORE_DB):
        row.save()


def test_requeue_of_a_dead_letter__drops_its_key():
    q = store.queue("u")
    first = q.enqueue({}, unique_key="k")
    assert q.claim_one("w").fail()
    second = q.enqueue({}, unique_key="k")
    assert requeue_dead([first]) == 1
    assert store.get_job(first).unique_key is None
    assert q.enqueue({}, unique_key="k") == second


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"unique_key": ""}, "Invalid unique_key ''"),
        ({"unique_key": 42}, "Invalid unique_key 42"),
        ({"unique_key": "x" * 201}, "at most 200 characters"),
        ({"unique_key": "a\x00b"}, "without NUL"),
        ({"unique_key": "k", "on_duplicate": "ignore"}, "Invalid on_duplicate 'ignore'"),
        ({"unique_key": "k", "unique_for_s": 0}, "Invalid unique_for_s 0"),
        ({"unique_key": "k", "unique_for_s": "1"}, "Invalid unique_for_s '1'"),
        ({"unique_for_s": 10}, "apply to jobs with a unique key"),
        ({"on_duplicate": "raise"}, "apply to jobs with a unique key"),
    ],
)
def test_enqueue__refuses_bad_unique_options_before_any_write(kwargs, message):
    with pytest.raises(InvalidArgument, match=message):
        store.queue("u").enqueue({}, **kwargs)
    assert live_count() == 0


def test_enqueue_many__refuses_keys_that_do_not_match_the_payloads():
    q = store.queue("u")
    with pytest.raises(InvalidArgument, match="2 keys for 3 payloads"):
        q.enqueue_many([1, 2, 3], unique_keys=["a", "b"])
    with pytest.raises(InvalidArgument, match="expected a list of keys"):
        q.enqueue_many([1], unique_keys="a")
    with pytest.raises(InvalidArgument, match="Invalid unique_key None"):
        q.enqueue_many([1, 2], unique_keys=["a", None])
    assert live_count() == 0


def test_outbox_enqueue__keeps_one_undelivered_message_per_key():
    outbox = store.outbox("hooks")
    first = outbox.enqueue({"n": 1}, unique_key="order:1")
    assert outbox.enqueue({"n": 2}, unique_key="order:1") == first
    with pytest.raises(DuplicateJob):
        outbox.enqueue({"n": 3}, unique_key="order:1", on_duplicate="raise")
    assert outbox.run_once("w", lambda handle: None)
    assert outbox.enqueue({"n": 4}, unique_key="order:1") != first


def test_a_keyed_job_keeps_every_stamp_of_its_enqueue():
    q = store.queue("u", visibility_timeout_s=42)
    at = (db_now() + timedelta(hours=1)).replace(microsecond=0)
    first = store.get_job(
        q.enqueue(
            {"n": 1}, unique_key="at", run_at=at, priority=5, expires_s=7200, max_attempts=9,
            timeout_s=3,
        )
    )  # fmt: skip
    assert first.run_at == at
    assert (first.priority, first.max_attempts, first.timeout_s) == (5, 9, 3)
    assert (first.visibility_timeout_s, first.payload) == (42, {"n": 1})
    assert abs((first.expires_at - first.enqueued_at).total_seconds() - 7200) < 0.01
    (second_id,) = q.enqueue_many([{"n": 2}], unique_keys=["delay"], delay_s=60)
    second = store.get_job(second_id)
    assert abs((second.run_at - second.enqueued_at).total_seconds() - 60) < 0.01
    assert second.expires_at is None
