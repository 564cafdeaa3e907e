"""The dead letters' day partitions on PostgreSQL: made ahead, DEFAULT drained, old days dropped.

The test database was migrated through 0017, so its dead letters are
partitioned (today and the next days); every other dead-letter test runs on
that layout too. Old rows are written with explicit ``died_at`` values, which
land in DEFAULT until ``tend_partitions`` gives their day a partition.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connections, transaction
from django.test import override_settings

from alkstore_django import store
from alkstore_django.models import Attempt, DeadJob, UniqueWindow
from tests.factories import DeadJobFactory
from tests.helpers import ALKSTORE_DB, DIALECT, ROUTING, alkstore_connection, db_now, needs

pytestmark = pytest.mark.django_db

partitioned = needs(
    "supports_dead_letter_partitions",
    "no declarative partitioning here: the dead letters are one table, purged in batches",
)
DAY = timedelta(days=1)
WEEK_S = 7 * 86_400
FOREVER = {
    **ROUTING,
    "QUEUES": {"forever": {"dead_letter_retention_s": None}},
    "POLL_INTERVAL_S": 1.0,
}


def partitions() -> dict[str, int]:
    """Return {partition name: rows} of the dead-letter table."""
    with alkstore_connection().cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = %s::regclass ORDER BY 1",
            [DeadJob._meta.db_table],
        )
        names = [row[0] for row in cursor.fetchall()]
        counts = {}
        for name in names:
            cursor.execute(f"SELECT count(*) FROM {name}")
            counts[name] = cursor.fetchone()[0]
        return counts


def day_name(at: datetime) -> str:
    return f"{DeadJob._meta.db_table}_p{at.astimezone(UTC):%Y%m%d}"


def home_of(job_id: int) -> str:
    """Return the partition a dead letter lives in."""
    with alkstore_connection().cursor() as cursor:
        cursor.execute(
            f"SELECT tableoid::regclass::text FROM {DeadJob._meta.db_table} WHERE id = %s",
            [job_id],
        )
        return cursor.fetchone()[0]


def dead_on(day_start: datetime, queue: str, n: int = 1, attempts: int = 2) -> list[int]:
    """Write ``n`` dead letters of ``queue`` that died on ``day_start``'s day, with attempts."""
    ids = []
    for i in range(n):
        row = DeadJobFactory(queue=queue, died_at=day_start + timedelta(minutes=i))
        Attempt.objects.bulk_create(
            Attempt(job_id=row.id, queue=queue, attempt=a, error="boom")
            for a in range(1, attempts + 1)
        )
        ids.append(row.id)
    return ids


def start_of_day(days_ago: int) -> datetime:
    today = db_now().astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return today - days_ago * DAY


@partitioned
def test_tend_partitions__creates_the_next_days_ahead():
    now = db_now()
    ahead = day_name(now + 3 * DAY)
    with alkstore_connection().cursor() as cursor:
        cursor.execute(f"DROP TABLE {ahead}")
    assert ahead not in partitions()
    assert store.dialect.tend_partitions() == 1
    names = partitions()
    assert {day_name(now + i * DAY) for i in range(4)} <= set(names)
    assert store.dialect.tend_partitions() == 0


@partitioned
def test_upkeep__tends_the_partitions_among_its_chores():
    from alkstore_django.worker import upkeep

    ahead = day_name(db_now() + 2 * DAY)
    with alkstore_connection().cursor() as cursor:
        cursor.execute(f"DROP TABLE {ahead}")
    upkeep.tend_partitions(store, [])
    assert ahead in partitions()


@partitioned
def test_tend_partitions__skips_the_round_while_another_worker_holds_the_lease():
    ahead = day_name(db_now() + 3 * DAY)
    with alkstore_connection().cursor() as cursor:
        cursor.execute(f"DROP TABLE {ahead}")
    assert store.dialect.acquire_lock("__alkstore_dead_partitions", "other-worker", 60)
    assert store.dialect.tend_partitions() == 0
    assert ahead not in partitions()


@partitioned
@pytest.mark.django_db(transaction=True)
def test_tend_partitions__gives_up_for_the_round_behind_a_long_transaction_on_default():
    ahead = day_name(db_now() + 3 * DAY)
    with alkstore_connection().cursor() as cursor:
        cursor.execute(f"DROP TABLE {ahead}")
    locked, release = threading.Event(), threading.Event()

    def read_default_and_linger() -> None:
        try:
            with transaction.atomic(using=ALKSTORE_DB), alkstore_connection().cursor() as cursor:
                cursor.execute(f"SELECT count(*) FROM {DeadJob._meta.db_table}_default")
                locked.set()
                release.wait(30)
        finally:
            connections.close_all()

    reader = threading.Thread(target=read_default_and_linger)
    reader.start()
    try:
        assert locked.wait(10)
        started = time.monotonic()
        assert store.dialect.tend_partitions() == 0
        assert time.monotonic() - started < 10
        assert ahead not in partitions()
    finally:
        release.set()
        reader.join(10)
    assert store.dialect.tend_partitions() == 1


@partitioned
def test_tend_partitions__moves_rows_of_a_day_without_partition_out_of_default():
    # A day ten days ahead has no partition: its dead letter lands in DEFAULT,
    # and PostgreSQL would refuse to create the day's partition over it.
    later = start_of_day(-10) + timedelta(hours=5)
    (job_id,) = dead_on(later, "p-default")
    assert home_of(job_id) == f"{DeadJob._meta.db_table}_default"
    assert store.dialect.tend_partitions() == 1
    assert home_of(job_id) == day_name(later)
    assert partitions()[f"{DeadJob._meta.db_table}_default"] == 0
    assert store.get_job(job_id).state == "dead"


@partitioned
def test_sweep__drops_an_expired_day_with_its_attempt_history_and_windows():
    ids = dead_on(start_of_day(9), "p-old", n=3)
    UniqueWindow.objects.create(
        queue="p-old", unique_key="k", job_id=ids[0], held_until=db_now() + DAY
    )
    (young,) = dead_on(db_now() - timedelta(hours=1), "p-old")
    store.dialect.tend_partitions()
    old_day = day_name(start_of_day(9))
    assert partitions()[old_day] == 3

    assert store.queue("p-old").sweep_expired().purged == 3

    assert old_day not in partitions()
    assert not DeadJob.objects.filter(id__in=ids).exists()
    assert not Attempt.objects.filter(job_id__in=ids).exists()
    assert not UniqueWindow.objects.filter(job_id=ids[0]).exists()
    assert Attempt.objects.filter(job_id=young).count() == 2
    assert store.get_job(young).state == "dead"


@partitioned
@override_settings(ALKSTORE=FOREVER)
def test_sweep__keeps_a_day_holding_a_row_of_a_queue_that_keeps_dead_letters_for_ever():
    old = start_of_day(9)
    expired = dead_on(old, "p-old", n=2)
    (kept,) = dead_on(old + timedelta(hours=1), "forever")
    store.dialect.tend_partitions()

    assert store.queue("p-old").sweep_expired().purged == 2

    # The day stays; the expired rows went by the batched purge instead.
    assert partitions()[day_name(old)] == 1
    assert not DeadJob.objects.filter(id__in=expired).exists()
    assert store.get_job(kept).state == "dead"
    assert Attempt.objects.filter(job_id=kept).count() == 2


@partitioned
def test_sweep__leaves_the_rows_of_the_day_due_to_be_dropped_whole_to_the_drop():
    # The cutoff (seven days ago) falls inside this day, which holds only the
    # queue's rows: they go with the day once it is all past, not one by one.
    cutoff_day = (db_now() - timedelta(seconds=WEEK_S)).replace(
        hour=0, minute=0, second=0, microsecond=0
    )
    (job_id,) = dead_on(cutoff_day, "p-spared")
    store.dialect.tend_partitions()
    assert home_of(job_id) == day_name(cutoff_day)

    assert store.queue("p-spared").sweep_expired().purged == 0
    assert store.get_job(job_id).state == "dead"
    # A shorter retention than a day is kept to the letter, by the batched purge.
    short = store.queue("p-spared", dead_letter_retention_s=3_600)
    assert short.sweep_expired().purged == 1


@partitioned
def test_dead_letter_reads_and_moves__work_across_partitions():
    old = dead_on(start_of_day(2), "p-moves", n=2)
    store.dialect.tend_partitions()
    q = store.queue("p-moves")
    q.enqueue({"n": 1})
    (handle,) = q.claim_batch("w", 1)
    assert handle.fail("done for")
    assert {home_of(old[0]), home_of(handle.job.id)} == {
        day_name(start_of_day(2)),
        day_name(db_now()),
    }
    assert q.stats().dead == 3
    assert store.dialect.delete_dead([old[0]]) == 1
    moved = store.dialect.move_dead_to_live(alkstore_connection().cursor(), [old[1]])
    assert moved == {"p-moves": 1}
    assert store.get_job(old[1]).state == "pending"
    assert store.get_job(handle.job.id).state == "dead"


@pytest.mark.skipif(
    DIALECT.supports_dead_letter_partitions, reason="the sibling of the partitioned engine's tests"
)
def test_tend_partitions__makes_nothing_where_the_dead_letters_are_one_table():
    (job_id,) = dead_on(start_of_day(9), "p-old")
    assert store.dialect.tend_partitions() == 0
    assert store.queue("p-old").sweep_expired().purged == 1
    assert not DeadJob.objects.filter(id=job_id).exists()
