"""Schedules: the spec grammar, registration, the tick, and the leader loop."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connections
from django.db.models.functions import Now
from django.test import override_settings

from alkstore_django import store
from alkstore_django.errors import (
    InvalidArgument,
    InvalidName,
    InvalidSpec,
    LeadershipLost,
    PayloadError,
    ReservedName,
)
from alkstore_django.models import Job, Lock, Schedule
from alkstore_django.scheduler import LEADER_LOCK, tick
from tests.helpers import (
    ALKSTORE_DB,
    ROUTING,
    boundaries_ago,
    db_now,
    leader_lock,
    schedules_runner,
    wait_for,
)

pytestmark = pytest.mark.django_db


# --- the spec grammar and registration -----------------------------------------


@pytest.mark.parametrize(
    ("spec", "interval_s"),
    [("@every 1s", 1), ("@every 90s", 90), ("@every 5m", 300), ("@every 2h", 7200),
     ("@every 1d", 86_400), ("@every 400d", 400 * 86_400)],
)  # fmt: skip
def test_schedule__accepts_the_exact_grammar(spec, interval_s):
    record = store.schedule("beat", spec, "beats")

    assert (record.spec, record.interval_s) == (spec, interval_s)


@pytest.mark.parametrize(
    "spec",
    ["*/5 * * * *", "0 3 * * *", "@daily", "@hourly", "@every 0s", "@every 0m", "@every 1.5h",
     "@every 5", "@every s", "@every", "@every  5s", "@every 5s ", " @every 5s", "@every\t5s",
     "@every -5s", "@every +5s", "@every 05s", "@every 5S", "@every 5w", "@every 5ms",
     "@every 5 s", "@EVERY 5s", "every 5s", "@every 1e3s", "", None, 5, b"@every 5s"],
)  # fmt: skip
def test_schedule__refuses_everything_else_before_any_query(spec, django_assert_num_queries):
    with django_assert_num_queries(0), pytest.raises(InvalidSpec, match="expected '@every"):
        store.schedule("beat", spec, "beats")


@pytest.mark.parametrize(
    ("name", "queue", "kwargs", "error"),
    [
        ("", "beats", {}, InvalidName),
        ("beat", "", {}, InvalidName),
        ("__alkstore_beat", "beats", {}, ReservedName),
        ("beat", "__alkstore_outbox:webhooks", {}, ReservedName),
        ("beat", "beats", {"priority": 1.5}, InvalidArgument),
        ("beat", "beats", {"max_attempts": 0}, InvalidArgument),
        ("beat", "beats", {"expires_s": 0}, InvalidArgument),
        ("beat", "beats", {"payload": {1, 2}}, PayloadError),
    ],
)
def test_schedule__refuses_bad_arguments_before_any_query(
    name, queue, kwargs, error, django_assert_num_queries
):
    with django_assert_num_queries(0), pytest.raises(error):
        store.schedule(name, "@every 1m", queue, **kwargs)


def test_schedule__first_fire_is_the_first_epoch_boundary_after_registration():
    before = db_now()
    record = store.schedule("report", "@every 1h", "reports", {"kind": "hourly"})

    assert record.next_run_at.timestamp() % 3600 == 0
    assert before < record.next_run_at <= before + timedelta(hours=1)
    assert record.payload == {"kind": "hourly"}
    assert record.enabled is True
    assert record.last_fired_at is None


@override_settings(
    ALKSTORE={
        **ROUTING,
        "QUEUES": {"reports": {"visibility_timeout_s": 30, "priority": 2, "max_attempts": 7}},
    }
)
def test_schedule__resolves_its_stamps_over_the_target_queue_defaults():
    record = store.schedule("report", "@every 1m", "reports", max_attempts=9, expires_s=600)

    assert record.priority == 2
    assert record.max_attempts == 9
    assert record.visibility_timeout_s == 30
    assert record.retry_base_s == 5
    assert record.expires_s == 600


def test_schedule__reregistering_an_unchanged_spec_keeps_next_run_at():
    store.schedule("report", "@every 1m", "reports", {"v": 1})
    far = datetime(2030, 1, 1, tzinfo=UTC)
    Schedule.objects.filter(name="report").update(next_run_at=far)

    record = store.schedule("report", "@every 1m", "other", {"v": 2}, priority=4)

    assert record.next_run_at == far
    assert (record.queue, record.payload, record.priority) == ("other", {"v": 2}, 4)
    assert Schedule.objects.count() == 1


def test_schedule__a_changed_spec_recomputes_next_run_at():
    store.schedule("report", "@every 1m", "reports")
    Schedule.objects.filter(name="report").update(next_run_at=datetime(2030, 1, 1, tzinfo=UTC))

    record = store.schedule("report", "@every 1h", "reports")

    assert record.interval_s == 3600
    assert record.next_run_at <= db_now() + timedelta(hours=1)
    assert record.next_run_at.timestamp() % 3600 == 0


def test_schedule__a_paused_schedule_stays_paused_when_reregistered():
    store.schedule("report", "@every 1m", "reports")
    Schedule.objects.filter(name="report").update(enabled=False)

    assert store.schedule("report", "@every 1m", "reports").enabled is False


def test_unschedule__deletes_and_says_whether_there_was_one():
    store.schedule("report", "@every 1m", "reports")

    assert store.unschedule("report") is True
    assert store.unschedule("report") is False
    assert not Schedule.objects.exists()


# --- the tick --------------------------------------------------------------------


@override_settings(
    ALKSTORE={**ROUTING, "QUEUES": {"reports": {"visibility_timeout_s": 30, "priority": 2}}}
)
def test_tick__fires_one_job_per_elapsed_boundary_with_the_schedule_stamps():
    store.schedule("report", "@every 10s", "reports", {"kind": "x"}, max_attempts=9, expires_s=60)
    boundaries_ago("report", 3)

    assert tick(store) == 3

    jobs = list(Job.objects.filter(queue="reports").order_by("id"))
    assert len(jobs) == 3
    for job in jobs:
        assert job.payload == {"kind": "x"}
        assert (job.priority, job.max_attempts, job.visibility_timeout_s) == (2, 9, 30)
        assert job.retry_base_s == 5
        assert 59 <= (job.expires_at - job.enqueued_at).total_seconds() <= 60
    row = Schedule.objects.get(name="report")
    assert row.next_run_at > db_now()
    assert row.next_run_at.timestamp() % 10 == 0
    assert row.last_fired_at is not None
    assert tick(store) == 0


def test_tick__leaves_schedules_that_are_not_due_or_paused_alone():
    store.schedule("later", "@every 1h", "reports")
    store.schedule("paused", "@every 10s", "reports")
    boundaries_ago("paused", 2)
    Schedule.objects.filter(name="paused").update(enabled=False)

    assert tick(store) == 0
    assert not Job.objects.exists()


def test_tick__catch_up_fires_at_most_64_and_skips_the_rest_for_good():
    store.schedule("report", "@every 1m", "reports")
    boundaries_ago("report", 200)

    assert tick(store) == 64

    assert Job.objects.filter(queue="reports").count() == 64
    row = Schedule.objects.get(name="report")
    assert row.next_run_at > db_now()
    assert tick(store) == 0
    assert Job.objects.filter(queue="reports").count() == 64


def test_tick__jobs_join_the_callers_transaction():
    from django.db import transaction

    store.schedule("report", "@every 10s", "reports")
    boundaries_ago("report", 1)

    with pytest.raises(RuntimeError), transaction.atomic(using=ALKSTORE_DB):
        assert tick(store) == 1
        raise RuntimeError("roll back")

    assert not Job.objects.exists()
    assert Schedule.objects.get(name="report").next_run_at <= db_now()


# --- the leader loop ---------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_run_schedules__two_loops_fire_each_boundary_exactly_once():
    first_at = store.schedule("beat", "@every 1s", "beats").next_run_at
    a = schedules_runner(owner="runner-a").start()
    assert wait_for(leader_lock, 5), "the first runner did not take leadership"
    b = schedules_runner(owner="runner-b").start()
    b.thread.join(5)

    assert isinstance(b.error, LeadershipLost)
    assert wait_for(lambda: Job.objects.filter(queue="beats").count() >= 5, 10)
    a.halt()

    assert a.error is None
    fired = Job.objects.filter(queue="beats").count()
    elapsed = Schedule.objects.get(name="beat").next_run_at - first_at
    assert fired == int(elapsed.total_seconds()) >= 5


@pytest.mark.django_db(transaction=True)
def test_run_schedules__a_rogue_tick_without_the_lock_cannot_double_fire():
    first_at = store.schedule("beat", "@every 1s", "beats").next_run_at
    a = schedules_runner().start()
    assert wait_for(leader_lock, 5)
    stop_rogue = threading.Event()
    rogue_fired = []

    def rogue() -> None:
        try:
            while not stop_rogue.is_set():
                rogue_fired.append(tick(store))
                time.sleep(0.01)
        finally:
            connections.close_all()

    thread = threading.Thread(target=rogue, daemon=True)
    thread.start()
    assert wait_for(lambda: Job.objects.filter(queue="beats").count() >= 5, 10)
    stop_rogue.set()
    thread.join(5)
    a.halt()

    assert a.error is None
    assert len(rogue_fired) > 5
    fired = Job.objects.filter(queue="beats").count()
    elapsed = Schedule.objects.get(name="beat").next_run_at - first_at
    assert fired == int(elapsed.total_seconds()) >= 5


@pytest.mark.django_db(transaction=True)
def test_run_schedules__holds_leadership_through_a_sleep_longer_than_the_ttl():
    store.schedule("slow", "@every 40s", "beats")
    a = schedules_runner(owner="runner-a").start()
    first = wait_for(leader_lock, 5)
    assert first is not None
    seen = set()
    deadline = time.monotonic() + 4.5
    while time.monotonic() < deadline:
        row = Lock.objects.get(name=LEADER_LOCK)
        left_s = (row.expires_at - db_now()).total_seconds()
        assert (row.owner, row.fence) == ("runner-a", first.fence)
        assert left_s > 0, "leadership lapsed during the sleep"
        seen.add(row.expires_at)
        time.sleep(0.25)
    a.halt()

    assert a.error is None
    assert len(seen) >= 3  # the take and at least two 2-second renewals
    assert max(seen) - first.expires_at >= timedelta(seconds=1.5)  # pushed past the first TTL


@pytest.mark.django_db(transaction=True)
def test_run_schedules__raises_leadership_lost_before_firing_again():
    store.schedule("beat", "@every 1s", "beats")
    a = schedules_runner(owner="runner-a").start()
    assert wait_for(lambda: Job.objects.filter(queue="beats").exists(), 5)

    Lock.objects.filter(name=LEADER_LOCK).update(
        owner="thief", fence=99, expires_at=Now() + timedelta(seconds=60)
    )
    fired_before = Job.objects.filter(queue="beats").count()
    a.thread.join(5)

    assert isinstance(a.error, LeadershipLost)
    assert "runner-a" in str(a.error)
    time.sleep(1.2)
    assert Job.objects.filter(queue="beats").count() == fired_before
    assert Lock.objects.get(name=LEADER_LOCK).owner == "thief"


@pytest.mark.django_db(transaction=True)
@override_settings(
    ALKSTORE={**ROUTING, "SCHEDULES": {"nightly-report": {"spec": "@every 1d", "queue": "reports",
                                               "payload": {"report": "nightly"}}}}
)  # fmt: skip
def test_run_schedules__registers_declared_schedules_and_releases_on_stop():
    a = schedules_runner(owner="runner-a").start()
    assert wait_for(lambda: Schedule.objects.filter(name="nightly-report").exists(), 5)
    assert leader_lock() is not None

    started = time.monotonic()
    a.halt()

    assert time.monotonic() - started < 3.0
    assert a.error is None
    assert leader_lock() is None
    record = Schedule.objects.get(name="nightly-report")
    assert (record.spec, record.queue, record.payload) == ("@every 1d", "reports",
                                                           {"report": "nightly"})  # fmt: skip
    b = schedules_runner(owner="runner-b").start()
    assert wait_for(lambda: getattr(leader_lock(), "owner", None) == "runner-b", 3)
    b.halt()
    assert b.error is None


@pytest.mark.django_db(transaction=True)
def test_run_schedules__notices_a_new_schedule_within_about_a_second():
    store.schedule("idle", "@every 1d", "reports")
    a = schedules_runner().start()
    assert wait_for(leader_lock, 5)
    time.sleep(0.5)  # the loop is now in its long sleep

    registered = time.monotonic()
    store.schedule("beat", "@every 1s", "beats")
    assert wait_for(lambda: Job.objects.filter(queue="beats").exists(), 5)
    a.halt()

    assert time.monotonic() - registered < 4.0
    assert a.error is None
