"""Tiny helpers named after a state; they move timestamps against the database clock."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta

from django.db.models.functions import Now

from alkstore_django.models import DeadJob, Job


def lapse_claim(job_id: int, seconds_ago: float = 1.0) -> None:
    """Put the claim deadline of a processing job in the past."""
    Job.objects.filter(id=job_id).update(claim_expires_at=Now() - timedelta(seconds=seconds_ago))


def make_due(job_id: int) -> None:
    """Make a pending job due now (a delayed job or a retry's backoff)."""
    Job.objects.filter(id=job_id).update(run_at=Now() - timedelta(milliseconds=1))


def expire_job(job_id: int) -> None:
    """Put a live job's expiry in the past."""
    Job.objects.filter(id=job_id).update(expires_at=Now() - timedelta(seconds=1))


def age_dead(job_id: int, seconds: float) -> None:
    """Make a dead letter ``seconds`` older."""
    DeadJob.objects.filter(id=job_id).update(died_at=Now() - timedelta(seconds=seconds))


def db_now():
    """Return the database's clock (the only clock the queue uses)."""
    from alkstore_django import store

    return store.dialect.database_now()


def live_count(queue: str | None = None) -> int:
    """Count live rows, of one queue or of all."""
    rows = Job.objects.all() if queue is None else Job.objects.filter(queue=queue)
    return rows.count()


def dead_count(queue: str | None = None) -> int:
    """Count dead letters, of one queue or of all."""
    rows = DeadJob.objects.all() if queue is None else DeadJob.objects.filter(queue=queue)
    return rows.count()


def fill_pending(queue: str, n: int) -> None:
    """Insert ``n`` pending rows into ``queue`` in one statement (fast backlogs for plans)."""
    from django.db import connection

    table = Job._meta.db_table
    columns = (
        "queue, payload, priority, run_at, attempts, max_attempts, visibility_timeout_s, "
        "retry_base_s, state, enqueued_at"
    )
    if connection.vendor == "postgresql":
        sql = (
            f"INSERT INTO {table} ({columns}) SELECT %s, '{{}}'::jsonb, g %% 10, "
            "now() - make_interval(secs => g), 0, 3, 300, 5, 'pending', now() "
            "FROM generate_series(1, %s) AS g"
        )
    elif connection.vendor == "mysql":
        # MariaDB's sequence engine; no recursion limit to raise.
        sql = (
            f"INSERT INTO {table} ({columns}) SELECT %s, '{{}}', seq %% 10, "
            "UTC_TIMESTAMP(6) - INTERVAL seq SECOND, 0, 3, 300, 5, 'pending', UTC_TIMESTAMP(6) "
            "FROM seq_1_to_%s"
        )
    else:
        sql = (
            "WITH RECURSIVE g(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM g WHERE x < %s) "
            f"INSERT INTO {table} ({columns}) SELECT %s, '{{}}', x %% 10, "
            "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', printf('-%%d seconds', x)), "
            "0, 3, 300, 5, 'pending', strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') FROM g"
        )
    params = [n, queue] if connection.vendor == "sqlite" else [queue, n]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def analyze_tables() -> None:
    """Refresh the planner's statistics of the job tables.

    On MariaDB/MySQL ``ANALYZE TABLE`` commits the open transaction: a test
    that calls this there must be a transactional one.
    """
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute(f"ANALYZE TABLE {Job._meta.db_table}, {DeadJob._meta.db_table}")
            cursor.fetchall()
        else:
            cursor.execute("ANALYZE")


def wait_for(predicate: Callable[[], object], timeout: float = 20.0, interval: float = 0.05):
    """Poll ``predicate`` until it is truthy or ``timeout`` passes; return its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return predicate()


def runworker(env, *args, wait=True, timeout=90, new_session=False):
    """Run ``manage.py runworker *args`` on the test database as a real subprocess.

    With ``wait`` return (exit code, output text); otherwise the running
    ``Popen`` (output on a pipe). ``new_session`` makes it a process group
    leader, so a test can signal the worker and its sentinel together.
    """
    import subprocess
    import sys

    # The environment's settings module: a ``settings_variant`` names its own.
    settings_module = env.get("DJANGO_SETTINGS_MODULE", "tests.settings")
    cmd = [sys.executable, "-m", "django", "runworker", "--settings", settings_module, *args]
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=new_session,
    )
    if not wait:
        return proc
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out
