"""Each retention batch is served by its index: it reads the rows it deletes, not the ones it keeps.

Every table holds 5,000 rows the prune keeps and a few it deletes; the
statement explained is the one the prune really ran (captured, parameters
inlined), after ANALYZE.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from alkstore_django import presence, results, store
from alkstore_django.models import (
    DeadJob,
    JobResult,
    LiveWorker,
    OutcomeMinute,
    ScheduleFire,
    UniqueWindow,
)
from alkstore_django.throughput import prune_throughput
from tests.factories import DEAD_ID_BASE
from tests.helpers import DIALECT, db_now

# ANALYZE TABLE commits on MariaDB/MySQL: those tests flush the tables instead.
pytestmark = pytest.mark.django_db(transaction=True)

KEPT = 5_000


def analyze(*models) -> None:
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute("ANALYZE TABLE " + ", ".join(m._meta.db_table for m in models))
            cursor.fetchall()
        else:
            cursor.execute("ANALYZE")


def explain(sql: str) -> str:
    """Return the plan of an inlined statement, one line per step, on every engine."""
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("EXPLAIN QUERY PLAN " + sql)
            return "\n".join(str(row[-1]) for row in cursor.fetchall())
        cursor.execute("EXPLAIN " + sql)
        if connection.vendor == "mysql":
            columns = [c[0] for c in cursor.description]
            rows = [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
            return "\n".join(f"{r['table']} {r['type']} {r['key']} {r['Extra']}" for r in rows)
        return "\n".join(row[0] for row in cursor.fetchall())


def ran(prune, table: str, verb: str = "DELETE") -> str:
    """Run ``prune``; return the last ``verb`` statement it sent on ``table``."""
    with CaptureQueriesContext(connection) as captured:
        prune()
    found = [
        q["sql"]
        for q in captured.captured_queries
        if q["sql"].lstrip().upper().startswith(verb) and table in q["sql"].split("WHERE")[0]
    ]
    assert found, captured.captured_queries
    return found[-1]


def assert_uses(index: str | tuple[str, ...], table: str, plan: str) -> None:
    indexes = (index,) if isinstance(index, str) else index
    assert any(name in plan for name in indexes), plan
    assert f"Seq Scan on {table}" not in plan, plan
    assert f"{table} ALL " not in plan, plan
    assert not any(line.strip() == f"SCAN {table}" for line in plan.splitlines()), plan


def test_results_prune__walks_alk_result_expiry():
    now = db_now()
    JobResult.objects.bulk_create(
        JobResult(job_id=i, queue="q", state="succeeded", attempts=1, finished_at=now,
                  expires_at=now + timedelta(seconds=-60 if i < 3 else 3600))
        for i in range(KEPT + 3)
    )  # fmt: skip
    analyze(JobResult)
    table = JobResult._meta.db_table
    assert_uses("alk_result_expiry", table, explain(ran(lambda: results.prune(store), table)))


def test_throughput_prune__walks_alk_outcome_by_minute():
    now = db_now().replace(second=0, microsecond=0)
    OutcomeMinute.objects.bulk_create(
        OutcomeMinute(queue=f"q{i % 50}", minute=now - timedelta(minutes=i // 50), acked=1)
        for i in range(KEPT)
    )
    OutcomeMinute.objects.create(queue="q", minute=now - timedelta(days=3), acked=1)
    analyze(OutcomeMinute)
    table = OutcomeMinute._meta.db_table
    plan = explain(ran(lambda: prune_throughput(connection.alias), table))
    assert_uses("alk_outcome_by_minute", table, plan)


def test_worker_purge__walks_alk_worker_seen():
    now = db_now()
    LiveWorker.objects.bulk_create(
        LiveWorker(worker_id=f"w{i}", host="h", pid=i, pool="threads", concurrency=1,
                   last_seen_at=now - timedelta(hours=1 if i < 3 else 0))
        for i in range(KEPT + 3)
    )  # fmt: skip
    analyze(LiveWorker)
    table = LiveWorker._meta.db_table
    assert_uses(
        "alk_worker_seen", table, explain(ran(lambda: presence.purge_gone("default"), table))
    )


def test_window_purge__walks_alk_unique_window_until():
    now = db_now()
    UniqueWindow.objects.bulk_create(
        UniqueWindow(queue="w.q", unique_key=f"k{i}", job_id=i,
                     held_until=now + timedelta(seconds=-5 if i < 3 else 3600))
        for i in range(KEPT + 3)
    )  # fmt: skip
    analyze(UniqueWindow)
    table = UniqueWindow._meta.db_table
    plan = explain(ran(lambda: store.dialect.purge_windows("w.q"), table))
    assert_uses("alk_unique_window_until", table, plan)


def test_fire_prune__walks_alk_fire_boundary():
    now = db_now()
    ScheduleFire.objects.bulk_create(
        ScheduleFire(job_id=i, schedule="s", boundary=now - timedelta(days=40 if i < 3 else 1))
        for i in range(KEPT + 3)
    )
    analyze(ScheduleFire)
    table = ScheduleFire._meta.db_table

    def prune():
        with store.dialect.write_transaction():
            store.dialect.prune_fires(now - timedelta(days=30), 100)

    assert_uses("alk_fire_boundary", table, explain(ran(prune, table)))


def test_dead_letter_purge__reads_its_batch_on_a_died_at_index():
    now = db_now()
    DeadJob.objects.bulk_create(
        DeadJob(id=DEAD_ID_BASE + i, queue="dead.q", payload={}, priority=0, run_at=now,
                attempts=1, max_attempts=1, visibility_timeout_s=300, retry_base_s=5,
                enqueued_at=now, last_error="x",
                died_at=now - timedelta(days=8 if i < 3 else 0))
        for i in range(KEPT + 3)
    )  # fmt: skip
    analyze(DeadJob)
    table = DeadJob._meta.db_table
    select = ran(lambda: store.dialect.purge_dead("dead.q", 7 * 86_400), table, verb="SELECT")
    assert "ORDER BY died_at" in select
    plan = explain(select)
    if DIALECT.supports_dead_letter_partitions:
        # Day partitions (PostgreSQL): the kept rows' day is pruned from the plan;
        # what is read is the partition of the old rows, which all go.
        assert f"{table}_p{now:%Y%m%d}" not in plan, plan
        return
    # With one queue in the table, a planner may walk alk_dead_died and filter
    # the queue: the same rows read, the few that die.
    assert_uses(("alk_dead_queue_died", "alk_dead_died"), table, plan)
