"""The transactional outbox: publish on commit, deliver, retry, dead-letter."""

from __future__ import annotations

import pytest
from django.db import transaction

from alkstore_django import Fail, store
from alkstore_django.errors import InvalidArgument, InvalidName, ReservedName
from alkstore_django.models import DeadJob, Job
from alkstore_django.notify import open_watcher
from tests.helpers import ALKSTORE_DB, ROUTING, db_now, make_due, waiting_worker

pytestmark = pytest.mark.django_db


def test_outbox__is_backed_by_its_reserved_queue_with_fixed_stamps():
    outbox = store.outbox("webhooks")

    assert outbox.queue.name == "__alkstore_outbox:webhooks"
    job = store.get_job(outbox.enqueue({"event": "order.paid"}))
    assert (job.queue, job.payload, job.state) == (outbox.queue.name, {"event": "order.paid"},
                                                   "pending")  # fmt: skip
    assert (job.visibility_timeout_s, job.max_attempts, job.retry_base_s) == (60, 5, 5)
    with pytest.raises(ReservedName):
        store.queue(outbox.queue.name)


def test_outbox__ignores_queue_settings_for_its_backing_queue(settings):
    settings.ALKSTORE = {
        **ROUTING,
        "QUEUES": {"webhooks": {"max_attempts": 9, "visibility_timeout_s": 5}},
    }

    job = store.get_job(store.outbox("webhooks").enqueue({}))

    assert (job.visibility_timeout_s, job.max_attempts) == (60, 5)


def test_enqueue__max_attempts_is_the_per_message_override():
    job = store.get_job(store.outbox("webhooks").enqueue({}, max_attempts=2))

    assert (job.max_attempts, job.visibility_timeout_s, job.retry_base_s) == (2, 60, 5)


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("", InvalidName),
        (None, InvalidName),
        ("__alkstore_x", ReservedName),
        ("x" * 190, InvalidName),
    ],
)
def test_outbox__refuses_bad_names_before_any_query(name, error, django_assert_num_queries):
    with django_assert_num_queries(0), pytest.raises(error):
        store.outbox(name)


def test_run_once__refuses_a_bad_worker_id():
    with pytest.raises(InvalidArgument, match="worker_id"):
        store.outbox("webhooks").run_once("", lambda handle: None)


@pytest.mark.django_db(transaction=True)
def test_enqueue__rolls_back_with_the_callers_transaction():
    outbox = store.outbox("webhooks")

    with pytest.raises(RuntimeError), transaction.atomic(using=ALKSTORE_DB):
        outbox.enqueue({"event": "order.paid"})
        raise RuntimeError("the business write failed")

    assert not Job.objects.exists()
    assert outbox.run_once("w1", lambda handle: None) is False


@pytest.mark.django_db(transaction=True)
def test_enqueue__commit_publishes_the_message_and_wakes_the_worker():
    outbox = store.outbox("webhooks")
    # Producers wake only a waiting worker; its row is written before the
    # watch starts (SQLite's watcher wakes on any commit).
    with waiting_worker(outbox.queue.name):
        watcher = open_watcher(store, [outbox.queue.channel], queues=[outbox.queue.name])
        try:
            with transaction.atomic(using=ALKSTORE_DB):
                job_id = outbox.enqueue({"event": "order.paid"})
                assert not watcher.wait(0.3), "woken before the commit"
            assert watcher.wait(5), "not woken by the commit"
        finally:
            watcher.close()

    assert store.get_job(job_id).state == "pending"


def test_run_once__acks_a_delivery_that_returns():
    outbox = store.outbox("webhooks")
    job_id = outbox.enqueue({"event": "order.paid"})
    delivered = []

    assert outbox.run_once("w1", lambda handle: delivered.append(handle.job.payload)) is True

    assert delivered == [{"event": "order.paid"}]
    assert store.get_job(job_id) is None
    assert outbox.run_once("w1", lambda handle: None) is False


def test_run_once__retries_a_delivery_that_raises_with_a_backoff_gap_and_the_error():
    outbox = store.outbox("webhooks")
    job_id = outbox.enqueue({})

    def delivery(handle):
        raise ConnectionError("503 from https://hooks.example.com")

    assert outbox.run_once("w1", delivery) is True

    job = store.get_job(job_id)
    assert (job.state, job.attempts) == ("pending", 1)
    # The same text the worker stores: one outcome path for every runner.
    assert job.last_error == "ConnectionError: 503 from https://hooks.example.com"
    gap_s = (job.run_at - db_now()).total_seconds()
    assert 2 <= gap_s <= 5  # attempt 1 of base 5 s: [3, 5]
    assert outbox.run_once("w1", delivery) is False  # not due yet


def test_run_once__dead_letters_with_the_exception_text_when_exhausted():
    outbox = store.outbox("webhooks")
    job_id = outbox.enqueue({}, max_attempts=2)

    def delivery(handle):
        raise ValueError(f"refused on attempt {handle.job.attempts}")

    assert outbox.run_once("w1", delivery) is True
    make_due(job_id)
    assert outbox.run_once("w1", delivery) is True

    dead = DeadJob.objects.get(id=job_id)
    assert dead.last_error == "ValueError: refused on attempt 2"
    assert dead.attempts == 2
    assert store.get_job(job_id).state == "dead"


def test_run_once__fail_dead_letters_at_once():
    outbox = store.outbox("webhooks")
    job_id = outbox.enqueue({})

    def delivery(handle):
        raise Fail("410 Gone: endpoint removed")

    assert outbox.run_once("w1", delivery) is True

    assert DeadJob.objects.get(id=job_id).last_error == "410 Gone: endpoint removed"


def test_run_once__a_delivery_can_heartbeat():
    outbox = store.outbox("webhooks")
    job_id = outbox.enqueue({})
    seen = {}

    def delivery(handle):
        seen["claimed"] = store.get_job(job_id).claim_expires_at
        assert handle.heartbeat(600) is True
        seen["extended"] = store.get_job(job_id).claim_expires_at

    assert outbox.run_once("w1", delivery) is True

    assert (seen["extended"] - seen["claimed"]).total_seconds() > 500
    assert store.get_job(job_id) is None


def test_run_once__leaves_a_handle_the_delivery_settled_itself():
    outbox = store.outbox("webhooks")
    job_id = outbox.enqueue({})

    assert outbox.run_once("w1", lambda handle: handle.retry("later", delay_s=30)) is True

    job = store.get_job(job_id)
    assert (job.state, job.last_error) == ("pending", "later")
