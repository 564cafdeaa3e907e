"""Cron schedules on the database: zones, misfire policies, fired boundaries, refusals.

Runs on every engine; the boundary arithmetic is the spec value's, so the
expected boundaries are computed with it and the database only has to keep
``next_run_at`` (and the row lock) honest.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

import pytest
from django.db import connections
from django.test import override_settings

from alkstore_django import operations, store
from alkstore_django.checks import check_settings
from alkstore_django.errors import InvalidSpec, PayloadError
from alkstore_django.locks import acquire
from alkstore_django.models import Job, Lock, Schedule, ScheduleFire
from alkstore_django.scheduler import (
    LEADER_LOCK,
    MISFIRE_GRACE_S,
    REFUSED_RETRY_S,
    register_declared,
    serve,
    tick,
)
from alkstore_django.specs import boundaries, parse_spec
from tests.helpers import (
    ROUTING,
    VENDOR,
    alkstore_connection,
    boundaries_ago,
    db_now,
    leader_lock,
    schedules_runner,
    servers_only,
    unpooled,
    wait_for,
)

pytestmark = pytest.mark.django_db


def fired_boundaries(name: str) -> list:
    return list(
        ScheduleFire.objects.filter(schedule=name)
        .order_by("boundary")
        .values_list("boundary", flat=True)
    )


# --- registration ----------------------------------------------------------------


def test_schedule__a_cron_is_read_in_its_zone_stored_with_it():
    now = db_now()
    record = store.schedule("report", "@cron 0 9 * * mon-fri", "reports", zone="Europe/Paris")

    spec = parse_spec("@cron 0 9 * * mon-fri", "Europe/Paris")
    assert (record.zone, record.misfire, record.interval_s) == ("Europe/Paris", "all", None)
    assert record.next_run_at == spec.next_after(now)
    local = record.next_run_at.astimezone(spec.zone)
    assert (local.hour, local.minute, local.weekday() < 5) == (9, 0, True)


@override_settings(TIME_ZONE="UTC")
def test_schedule__the_zone_defaults_to_settings_time_zone():
    assert store.schedule("report", "@cron @daily", "reports").zone == "UTC"


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"spec": "0 9 * * *"}, "expected '@every <n><unit>'"),
        ({"spec": "@daily"}, "expected '@every <n><unit>'"),
        ({"spec": "@cron 0 25 * * *"}, "field 2 (hour) '25'"),
        ({"spec": "@cron 0 9 * * 1", "zone": "Europe/Pariss"}, "zone 'Europe/Pariss'"),
        ({"spec": "@cron 0 9 * * 1", "misfire": "none"}, "misfire policy 'none'"),
    ],
)
def test_schedule__refuses_a_bad_spec_zone_or_policy_before_any_query(
    kwargs, error, django_assert_num_queries
):
    spec = kwargs.pop("spec")
    with django_assert_num_queries(0), pytest.raises(InvalidSpec) as caught:
        store.schedule("report", spec, "reports", **kwargs)
    assert error in str(caught.value)


def test_schedule__a_changed_zone_recomputes_next_run_at():
    utc = store.schedule("report", "@cron 0 9 * * *", "reports", zone="UTC")
    paris = store.schedule("report", "@cron 0 9 * * *", "reports", zone="Europe/Paris")

    assert paris.next_run_at != utc.next_run_at
    assert paris.next_run_at.astimezone(parse_spec("@cron @daily", "Europe/Paris").zone).hour == 9


# --- misfire policies after an outage and a failover ----------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("policy", ["all", "latest", "skip"])
def test_misfire__after_a_three_hour_outage_a_standby_fires_by_policy(policy):
    spec_text = "@cron */5 * * * *"
    store.schedule("report", spec_text, "reports", misfire=policy)
    spec = parse_spec(spec_text, "UTC")
    # Three hours with no leader: the old leader's lease is about to lapse.
    first = spec.next_after(db_now() - timedelta(hours=3))
    Schedule.objects.filter(name="report").update(next_run_at=first)
    gone = acquire(store, LEADER_LOCK, ttl_s=1.0, owner="gone-host:1:dead")
    assert gone is not None
    stop = threading.Event()

    def standby() -> None:
        try:
            serve(store, stop, retry_s=0.2, owner="standby-host:2:live")
        finally:
            connections.close_all()

    thread = threading.Thread(target=standby, daemon=True)
    thread.start()
    # The database's time when the standby was seen caught up: a later reading
    # could cross the next boundary itself once the standby has stopped.
    seen: dict[str, object] = {}

    def caught_up() -> bool:
        seen["now"] = now = db_now()
        return Schedule.objects.get(name="report").next_run_at > now

    try:
        assert wait_for(caught_up, 15)
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()
    assert Lock.objects.get(name=LEADER_LOCK).fence == gone.fence + 1  # a failover

    row = Schedule.objects.get(name="report")
    fired = fired_boundaries("report")
    assert Job.objects.filter(queue="reports").count() == len(fired)
    assert row.next_run_at > seen["now"]
    if policy == "all":
        assert fired == boundaries(spec, first, row.last_fired_at, 64)
        assert len(fired) >= 36
    elif policy == "latest":
        # One fire for the outage (a real boundary may follow if one passed meanwhile).
        assert fired[-1] == spec.latest_at_or_before(row.last_fired_at)
        assert len(fired) == 1 or fired == [fired[1] - timedelta(minutes=5), fired[1]]
    else:
        # Nothing from the outage; at most a boundary that was on time.
        assert len(fired) <= 1
        assert all(b > row.next_run_at - timedelta(minutes=5, seconds=MISFIRE_GRACE_S)
                   for b in fired)  # fmt: skip


def test_misfire__skip_still_fires_a_boundary_on_time():
    store.schedule("beat", "@every 10s", "beats", misfire="skip")
    boundaries_ago("beat", 1)  # the latest boundary: at most 10 s late

    assert tick(store) == 1


def test_misfire__latest_fires_once_for_the_most_recent_boundary():
    store.schedule("beat", "@every 10s", "beats", misfire="latest")
    boundaries_ago("beat", 30)

    spec = parse_spec("@every 10s")
    before = spec.latest_at_or_before(db_now())
    assert tick(store) == 1
    (boundary,) = fired_boundaries("beat")
    # A boundary may pass between the tick and either read of the clock.
    assert boundary in {before, spec.latest_at_or_before(db_now())}


# --- a fired job knows its boundary ----------------------------------------------------


def test_fired_for__a_fired_job_carries_its_schedule_and_boundary():
    store.schedule("beat", "@every 10s", "beats", {"n": 1})
    first = boundaries_ago("beat", 3)
    plain = store.queue("beats").enqueue({"n": 2})

    assert tick(store) == 3

    jobs = Job.objects.filter(queue="beats").exclude(id=plain).order_by("id")
    fires = [store.fired_for(job.id) for job in jobs]
    assert [f.schedule for f in fires] == ["beat"] * 3
    assert [f.boundary for f in fires] == [first + timedelta(seconds=10 * i) for i in range(3)]
    assert store.fired_for(str(jobs[0].id)) == fires[0]  # a Tasks result id is text
    assert store.fired_for(plain) is None


# --- refused fires stay due (issue 12, case 11) --------------------------------------


def test_refused_fire__keeps_its_boundaries_due_and_says_why_on_the_schedule():
    store.schedule("big", "@every 10s", "reports", {"blob": "x" * 400})
    store.schedule("small", "@every 10s", "reports", {"n": 1})
    first = boundaries_ago("big", 2)
    boundaries_ago("small", 1)

    with override_settings(ALKSTORE={**ROUTING, "MAX_PAYLOAD_BYTES": 100}):
        assert tick(store) == 1  # the other schedule is not blocked

    row = Schedule.objects.get(name="big")
    now = db_now()
    assert row.refused_from == first
    assert "MAX_PAYLOAD_BYTES" in row.last_error and row.last_error.startswith("PayloadError")
    assert row.last_error_at is not None
    assert now < row.next_run_at <= now + timedelta(seconds=REFUSED_RETRY_S)
    assert not ScheduleFire.objects.filter(schedule="big").exists()

    # The limit is raised back; the retry fires the held boundaries, oldest first.
    Schedule.objects.filter(name="big").update(next_run_at=now)
    assert tick(store) >= 2
    fired = fired_boundaries("big")
    assert fired[:2] == [first, first + timedelta(seconds=10)]
    row = Schedule.objects.get(name="big")
    assert row.refused_from is None and row.next_run_at > db_now()


def test_refused_fire__a_skip_schedule_keeps_its_held_boundary():
    store.schedule("big", "@every 10s", "reports", {"blob": "x" * 400}, misfire="skip")
    first = boundaries_ago("big", 1)
    with override_settings(ALKSTORE={**ROUTING, "MAX_PAYLOAD_BYTES": 100}):
        assert tick(store) == 0
    # Long after the grace, the refusal is still owed.
    Schedule.objects.filter(name="big").update(
        refused_from=first - timedelta(seconds=10 * 60), next_run_at=db_now()
    )

    assert tick(store) >= 60


def test_refused_fire__resume_after_pause_drops_the_refusal():
    store.schedule("big", "@cron */5 * * * *", "reports", {"blob": "x" * 400})
    row = Schedule.objects.get(name="big")
    Schedule.objects.filter(pk=row.pk).update(
        refused_from=row.next_run_at - timedelta(hours=1), next_run_at=db_now()
    )

    assert operations.set_schedules_enabled([row.pk], False) == 1
    assert operations.set_schedules_enabled([row.pk], True) == 1

    row = Schedule.objects.get(pk=row.pk)
    assert row.refused_from is None
    assert row.next_run_at == parse_spec("@cron */5 * * * *").next_after(row.updated_at)


def test_schedule__the_payload_is_encoded_with_the_payload_codec():
    with pytest.raises(PayloadError):
        store.schedule("report", "@cron @daily", "reports", {"when": db_now()})
    codec = {**ROUTING, "PAYLOAD_CODEC": "alkstore_django.codecs.DjangoJSONCodec"}
    with override_settings(ALKSTORE=codec):
        when = db_now()
        record = store.schedule("report", "@cron @daily", "reports", {"when": when})
        Schedule.objects.filter(name="report").update(next_run_at=db_now())
        assert tick(store) == 1
    assert record.payload["when"].startswith(when.date().isoformat())
    assert Job.objects.get(queue="reports").payload == record.payload


# --- the leader's sleep survives a dropped connection (issue 12, case 11) -------------


def _drop_other_connections() -> int:
    """Kill every other session on the test database (the runner's), from the server side."""
    with alkstore_connection().cursor() as cursor:
        if VENDOR == "postgresql":
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            return cursor.fetchone()[0]
        cursor.execute(
            "SELECT id FROM information_schema.processlist "
            "WHERE db = DATABASE() AND id <> CONNECTION_ID()"
        )
        ids = [row[0] for row in cursor.fetchall()]
        for session in ids:
            cursor.execute(f"KILL {int(session)}")
        return len(ids)


@servers_only("SQLite has no server session to drop")
@unpooled("the pooler replaces a dropped server session unseen: the runner sees no error")
@pytest.mark.django_db(transaction=True)
def test_run_schedules__a_dropped_connection_while_sleeping_does_not_end_the_lead(caplog):
    store.schedule("idle", "@cron @yearly", "reports")
    a = schedules_runner(owner="runner-a").start()
    held = wait_for(leader_lock, 5)
    assert held is not None
    time.sleep(0.5)  # in the long sleep

    with caplog.at_level(logging.WARNING, logger="alkstore_django.scheduler"):
        assert _drop_other_connections() >= 1
        time.sleep(RENEW_WAIT_S)
        assert a.error is None and a.thread.is_alive()
        lock = Lock.objects.get(name=LEADER_LOCK)
        assert (lock.owner, lock.fence) == ("runner-a", held.fence)
        assert lock.expires_at > held.expires_at  # renewed on a new connection
    a.halt()

    assert a.error is None
    assert "database error while sleeping" in caplog.text


RENEW_WAIT_S = 4.5  # two renewal intervals and a reconnect


# --- settings schedules and admin edits ---------------------------------------------


@override_settings(
    ALKSTORE={**ROUTING, "SCHEDULES": {"report": {"spec": "@cron 0 9 * * *", "queue": "reports",
                                       "zone": "Europe/Paris", "misfire": "latest"}}}
)  # fmt: skip
def test_register_declared__marks_settings_schedules_and_logs_an_overwritten_edit(caplog):
    register_declared(store)
    row = Schedule.objects.get(name="report")
    assert (row.declared, row.zone, row.misfire) == (True, "Europe/Paris", "latest")

    register_declared(store)  # an unedited row: nothing to say
    assert "overwritten" not in caplog.text
    Schedule.objects.filter(name="report").update(spec="@cron 0 10 * * *", admin_edited_at=db_now())
    with caplog.at_level(logging.WARNING, logger="alkstore_django.scheduler"):
        register_declared(store)

    row = Schedule.objects.get(name="report")
    assert (row.spec, row.admin_edited_at) == ("@cron 0 9 * * *", None)
    assert "admin edit overwritten by ALKSTORE['SCHEDULES'] name=report" in caplog.text
    assert "spec '@cron 0 10 * * *' -> '@cron 0 9 * * *'" in caplog.text


# A valid cron longer than ``Schedule.spec``: every minute, hour and day listed.
LONG_CRON = "@cron {} {} {} * *".format(
    ",".join(map(str, range(60))), ",".join(map(str, range(24))), ",".join(map(str, range(1, 32)))
)


def test_schedule__a_valid_cron_longer_than_its_column_is_refused_and_nothing_written():
    assert len(LONG_CRON) > 255

    with pytest.raises(InvalidSpec, match=r"characters long; expected at most 255"):
        store.schedule("long", LONG_CRON, "reports")

    assert not Schedule.objects.exists()


def test_check__a_declared_cron_longer_than_its_column_is_an_error():
    declared = {**ROUTING, "SCHEDULES": {"long": {"spec": LONG_CRON, "queue": "reports"}}}
    with override_settings(ALKSTORE=declared):
        errors = [e.msg for e in check_settings() if e.id == "alkstore.E007"]

    assert len(errors) == 1 and "expected at most 255" in errors[0]
