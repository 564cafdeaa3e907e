"""Snooze: a handler puts its job off without spending an attempt, up to a cap."""

from __future__ import annotations

import threading

import pytest

from alkstore_django import store
from alkstore_django.errors import InvalidArgument
from alkstore_django.models import DeadJob
from alkstore_django.testing import run_ready_jobs
from alkstore_django.worker import Worker
from tests.helpers import db_now
from tests.testapp.models import Run

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_job_snoozed_five_times__ends_acked_with_one_attempt():
    job_id = store.queue("t.snooze").enqueue({"times": 5})
    stats = Worker(["t.snooze"], burst=True).run(threading.Event())
    assert (stats.snoozed, stats.acked) == (5, 1)
    assert store.get_job(job_id) is None
    assert list(Run.objects.filter(job_id=job_id).values_list("attempt", flat=True)) == [1] * 6


def test_the_snooze_cap__dead_letters_with_a_clear_error():
    job_id = store.queue("t.snooze", max_snoozes=2).enqueue({"times": 10})
    runs = run_ready_jobs(["t.snooze"])
    assert [r.outcome for r in runs] == ["snoozed", "snoozed", "dead"]
    dead = DeadJob.objects.get(id=job_id)
    assert dead.last_error == "snoozed 2 times: its max_snoozes is 2"
    assert (dead.attempts, dead.snoozes) == (1, 2)


def test_handle_snooze__is_due_after_the_delay_with_the_attempt_given_back():
    q = store.queue("handles")
    job_id = q.enqueue("x")
    handle = q.claim_one("w1")
    assert handle.snooze(60) is True
    job = store.get_job(job_id)
    assert (job.state, job.attempts, job.snoozes, job.worker_id) == ("pending", 0, 1, None)
    assert 58 < (job.run_at - db_now()).total_seconds() <= 60
    assert handle.snooze(60) is False  # a handle is spent once
    assert q.claim_one("w1") is None  # not due yet


def test_handle_snooze__refuses_a_bad_delay_and_changes_nothing():
    q = store.queue("handles")
    q.enqueue("x")
    handle = q.claim_one("w1")
    with pytest.raises(InvalidArgument, match="Invalid delay_s"):
        handle.snooze(-1)
    assert store.get_job(handle.job.id).state == "processing"
