"""The tests' one helpers module: import from here, never from a conftest.

- The engine under test: ``ROOT``, ``ENGINE``, ``VENDOR``, ``DIALECT``, ``POOLED``,
  ``database_url``.
- Skip markers, each saying why: ``postgres_only``, ``sqlite_only``, ``mysql_only``,
  ``servers_only``, ``unpooled``, ``pooled_only``, ``needs`` (a dialect capability),
  ``needs_django_tasks``.
- Tiny helpers named after a state; they move timestamps against the database
  clock: ``lapse_claim``, ``make_due``, ``expire_job``, ``age_dead``, ``expire_result``,
  ``db_now``, ``leader_lock``, ``boundaries_ago``.
- Counts and checks: ``live_count``, ``dead_count``, ``assert_acked_once``,
  ``check_ids``, ``listener_pids``, ``row_locked_elsewhere``.
- Planner set-up: ``fill_pending``, ``analyze_tables``.
- Processes, threads and polling: ``wait_for``, ``runworker``, ``manage``,
  ``LoopThread``, ``schedules_runner``.
- Hostile input: ``BOUNDED`` (Hypothesis settings), ``HOSTILE_NAMES``, ``SQL_INJECTION``.
- The admin: ``staff_with``, ``post_action``.

Markers themselves (``chaos``) are registered once, in pyproject.toml.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import django
import pytest
from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.db import connections
from django.db.models.functions import Now
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

from alkstore_django.conf import app_settings
from alkstore_django.dialects import dialect_class
from alkstore_django.models import DeadJob, Job, Lock, Schedule

# --- the engine under test ------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
ENGINE = settings.DATABASES["default"]["ENGINE"]
VENDOR = next((v for v in ("postgresql", "mysql") if v in ENGINE), "sqlite")
# The engine's capability flags: tests branch on these, as the package does.
DIALECT = dialect_class(VENDOR)
# scripts/test.sh's pgbouncer run: "default" goes through PgBouncer, "direct" past it.
POOLED = "direct" in settings.DATABASES


# The keys that say where alkstore's tables are (the queue-database run's "queues",
# PgBouncer's direct alias): a test that sets ALKSTORE keeps them, {**ROUTING, ...}.
ROUTING = {k: v for k, v in settings.ALKSTORE.items() if k in ("DATABASE", "LISTEN_DATABASE")}
# The alias alkstore's tables are on: ``transaction.atomic(using=ALKSTORE_DB)`` is what
# makes an enqueue part of a test's transaction there.
ALKSTORE_DB = settings.ALKSTORE.get("DATABASE", "default")


def alkstore_connection():
    """Return the connection of the alias alkstore's tables are on (``default`` or ``queues``)."""
    return connections[app_settings.database]


def database_url(alias: str = "default") -> str:
    """Return a DATABASE_URL for the database the tests are using (the test database)."""
    s = connections[alias].settings_dict
    vendor = connections[alias].vendor
    if vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    scheme, user, port = {"mysql": ("mysql", "root", 3306)}.get(
        vendor, ("postgres", "postgres", 5432)
    )
    user = s.get("USER") or user
    host = s.get("HOST") or "127.0.0.1"
    port = s.get("PORT") or port
    return f"{scheme}://{user}@{host}:{port}/{s['NAME']}"


# --- skip markers: a vendor-only test says why, and has a sibling elsewhere -----


def postgres_only(reason: str) -> pytest.MarkDecorator:
    """Skip on SQLite, saying what SQLite physically lacks and where the sibling is."""
    return pytest.mark.skipif(VENDOR != "postgresql", reason=f"PostgreSQL only: {reason}")


def site_database(reason: str) -> pytest.MarkDecorator:
    """Skip when alkstore is on its own database: no transaction spans the site's and its own."""
    return pytest.mark.skipif(
        ALKSTORE_DB != "default",
        reason=f"alkstore on the site's database only: {reason} (docs/settings.md)",
    )


def sqlite_only(reason: str) -> pytest.MarkDecorator:
    """Skip elsewhere: the test pins SQLite's own behaviour."""
    return pytest.mark.skipif(VENDOR != "sqlite", reason=f"SQLite only: {reason}")


def mysql_only(reason: str) -> pytest.MarkDecorator:
    """Skip elsewhere: the test pins MariaDB/MySQL's own behaviour."""
    return pytest.mark.skipif(VENDOR != "mysql", reason=f"MariaDB/MySQL only: {reason}")


def servers_only(reason: str) -> pytest.MarkDecorator:
    """Skip on SQLite: the test needs a database server (PostgreSQL or MariaDB/MySQL)."""
    return pytest.mark.skipif(VENDOR == "sqlite", reason=f"database servers only: {reason}")


def unpooled(reason: str) -> pytest.MarkDecorator:
    """Skip when the suite runs behind a transaction-mode pooler (scripts/test.sh pgbouncer)."""
    return pytest.mark.skipif(POOLED, reason=f"not behind a transaction-mode pooler: {reason}")


def pooled_only(reason: str) -> pytest.MarkDecorator:
    """Skip unless the suite runs behind a transaction-mode pooler (scripts/test.sh pgbouncer)."""
    return pytest.mark.skipif(not POOLED, reason=f"behind a transaction-mode pooler only: {reason}")


def needs(capability: str, reason: str) -> pytest.MarkDecorator:
    """Skip on an engine whose dialect lacks ``capability`` (a ``Dialect.supports_*`` flag)."""
    return pytest.mark.skipif(
        not getattr(DIALECT, capability), reason=f"{VENDOR} lacks {capability}: {reason}"
    )


def needs_django_tasks(reason: str = "") -> pytest.MarkDecorator:
    """Skip before Django 6.0, which brought the Tasks framework (``django.tasks``)."""
    because = "Django's Tasks framework needs Django 6.0+" + (f": {reason}" if reason else "")
    return pytest.mark.skipif(django.VERSION < (6, 0), reason=because)


# --- states, against the database clock -----------------------------------------


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


def expire_result(job_id: int) -> None:
    """Put a kept result's ``expires_at`` in the past."""
    from alkstore_django.models import JobResult

    JobResult.objects.filter(job_id=job_id).update(expires_at=Now() - timedelta(seconds=1))


def db_now() -> datetime:
    """Return the database's clock (the only clock the queue uses)."""
    from alkstore_django import store

    return store.dialect.database_now()


def leader_lock() -> Lock | None:
    """Return the scheduler's live leader lease, or None when nobody leads."""
    from alkstore_django.scheduler import LEADER_LOCK

    return Lock.objects.filter(name=LEADER_LOCK, expires_at__gt=Now()).first()


def boundaries_ago(name: str, n: int) -> datetime:
    """Put schedule ``name``'s next_run_at on the boundary ``n - 1`` intervals before the last.

    Leaves exactly ``n`` elapsed boundaries for the next tick.
    """
    row = Schedule.objects.get(name=name)
    last = math.floor(db_now().timestamp() / row.interval_s) * row.interval_s
    at = datetime.fromtimestamp(last - (n - 1) * row.interval_s, tz=UTC)
    Schedule.objects.filter(name=name).update(next_run_at=at)
    return at


# --- counts and checks ----------------------------------------------------------


def live_count(queue: str | None = None) -> int:
    """Count live rows, of one queue or of all."""
    rows = Job.objects.all() if queue is None else Job.objects.filter(queue=queue)
    return rows.count()


def dead_count(queue: str | None = None) -> int:
    """Count dead letters, of one queue or of all."""
    rows = DeadJob.objects.all() if queue is None else DeadJob.objects.filter(queue=queue)
    return rows.count()


def assert_acked_once(ids) -> None:
    """Assert every job of ``ids`` was acked, having run exactly once, at its first attempt."""
    from tests.testapp.models import Run

    assert not Job.objects.filter(id__in=ids).exists()
    assert not DeadJob.objects.filter(id__in=ids).exists()
    runs = sorted(Run.objects.filter(job_id__in=ids).values_list("job_id", "attempt"))
    assert runs == [(job_id, 1) for job_id in sorted(ids)]


def check_ids(messages) -> list[str]:
    """Return the ids of system-check messages, in order."""
    return [m.id for m in messages]


def listener_pids() -> list[int]:
    """Return the PostgreSQL backends of other sessions that are LISTENing (workers' watchers)."""
    with alkstore_connection().cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE query LIKE 'LISTEN %%' "
            "AND datname = current_database() AND pid <> pg_backend_pid()"
        )
        return [row[0] for row in cursor.fetchall()]


@contextmanager
def row_locked_elsewhere(job_id: int) -> Iterator[threading.Event]:
    """Hold ``SELECT ... FOR UPDATE`` on job ``job_id`` in another session until the block ends.

    Yields the release event: setting it lets go early. The lock is taken
    before the block starts.
    """
    from django.db import transaction

    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                Job.objects.select_for_update().get(id=job_id)
                locked.set()
                release.wait(10)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(10), f"another session could not lock job {job_id}"
        yield release
    finally:
        release.set()
        holder.join(10)


# --- planner set-up -------------------------------------------------------------


def fill_pending(queue: str, n: int) -> None:
    """Insert ``n`` pending rows into ``queue`` in one statement (fast backlogs for plans)."""
    table = Job._meta.db_table
    columns = (
        "queue, payload, priority, run_at, attempts, max_attempts, visibility_timeout_s, "
        "retry_base_s, state, enqueued_at"
    )
    if alkstore_connection().vendor == "postgresql":
        sql = (
            f"INSERT INTO {table} ({columns}) SELECT %s, '{{}}'::jsonb, g %% 10, "
            "now() - make_interval(secs => g), 0, 3, 300, 5, 'pending', now() "
            "FROM generate_series(1, %s) AS g"
        )
    elif alkstore_connection().vendor == "mysql":
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
    params = [n, queue] if alkstore_connection().vendor == "sqlite" else [queue, n]
    with alkstore_connection().cursor() as cursor:
        cursor.execute(sql, params)


def analyze_tables() -> None:
    """Refresh the planner's statistics of the job tables.

    On MariaDB/MySQL ``ANALYZE TABLE`` commits the open transaction: a test
    that calls this there must be a transactional one.
    """
    with alkstore_connection().cursor() as cursor:
        if alkstore_connection().vendor == "mysql":
            cursor.execute(f"ANALYZE TABLE {Job._meta.db_table}, {DeadJob._meta.db_table}")
            cursor.fetchall()
        else:
            cursor.execute("ANALYZE")


# --- processes and polling -----------------------------------------------------


def wait_for(predicate: Callable[[], object], timeout: float = 20.0, interval: float = 0.05):
    """Poll ``predicate`` until it is truthy or ``timeout`` passes; return its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return predicate()


class WorkerProcess(subprocess.Popen):
    """A running ``runworker`` whose output is read as it comes, by a thread of its own.

    Nothing else reads its pipe until ``communicate``: a worker that logged
    past the pipe's 64 KB (about a thousand job lines) would block on its
    next line, holding its claims, until the test gave up on it.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        with self.stdout:  # type: ignore[union-attr]
            for line in self.stdout:  # type: ignore[union-attr]
                self._lines.append(line)

    def communicate(self, input: Any = None, timeout: float | None = None) -> tuple[str, None]:
        """Wait for the exit and the end of the output (a sentinel may hold it open a little)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self.wait(timeout)
        self._reader.join(None if deadline is None else max(deadline - time.monotonic(), 0))
        if self._reader.is_alive():
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return "".join(self._lines), None


def runworker(env, *args, wait=True, timeout=90, new_session=False):
    """Run ``manage.py runworker *args`` on the test database as a real subprocess.

    With ``wait`` return (exit code, output text); otherwise the running
    ``WorkerProcess`` (its output read as it comes, returned by
    ``communicate``). ``new_session`` makes it a process group leader, so a
    test can signal the worker and its sentinel together.
    """
    # The environment's settings module: a ``settings_variant`` names its own.
    settings_module = env.get("DJANGO_SETTINGS_MODULE", "tests.settings")
    cmd = [sys.executable, "-m", "django", "runworker", "--settings", settings_module, *args]
    proc = (subprocess.Popen if wait else WorkerProcess)(
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


class LoopThread:
    """Run ``loop(store, stop, **kwargs)`` in a daemon thread, the way a command drives it.

    ``error`` keeps what the loop raised; ``halt`` sets ``stop`` and asserts the
    loop returned within ``timeout_s``.
    """

    def __init__(self, loop: Callable[..., object], **kwargs: object) -> None:
        self.loop = loop
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(kwargs,), daemon=True)

    def _run(self, kwargs: dict[str, object]) -> None:
        from alkstore_django import store

        try:
            self.loop(store, self.stop, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - the test asserts on it
            self.error = exc
        finally:
            connections.close_all()

    def start(self) -> LoopThread:
        self.thread.start()
        return self

    def halt(self, timeout_s: float = 5.0) -> None:
        self.stop.set()
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), f"{self.loop.__name__} did not return after stop"


def schedules_runner(owner: str | None = None) -> LoopThread:
    """Return ``run_schedules`` in a thread (not started), the way ``runscheduler`` drives it."""
    from alkstore_django.scheduler import run_schedules

    return LoopThread(run_schedules, owner=owner)


def run_python(python: str, env, code: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """Run ``code`` in a child Python with ``env``; return it finished (stdout, stderr as text)."""
    return subprocess.run(
        [python, "-c", code], env=env, capture_output=True, text=True, timeout=timeout
    )


def manage(env, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run ``python -m django *args`` in ``env`` and return the finished process (text output)."""
    return subprocess.run(
        [sys.executable, "-m", "django", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# --- hostile input -------------------------------------------------------------

# Property tests that are deterministic and bounded, writing no example database.
BOUNDED = hypothesis_settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=80,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
SQL_INJECTION = "'; DROP TABLE alkstore_django_job; --"
HOSTILE_NAMES = [
    "it's",
    'say "hi"',
    "with spaces and\ttabs\nand newlines",
    "ünïcødé ✓ 名前 🚀",
    SQL_INJECTION,
    '") OR 1=1; --',
    "%s %(name)s {now} %%",
    "\\",
    "LISTEN x; NOTIFY y",
    "x" * 200,
]


# --- the admin ------------------------------------------------------------------


def staff_with(*codenames: str) -> User:
    """Return a staff user holding exactly the alkstore_django permissions ``codenames``."""
    user = User.objects.create(username=f"staff-{'-'.join(codenames) or 'none'}", is_staff=True)
    perms = Permission.objects.filter(
        content_type__app_label="alkstore_django", codename__in=codenames
    )
    user.user_permissions.set(perms)
    return user


def post_action(client, url: str, action: str, ids: list, **extra):
    """POST the changelist action ``action`` on the rows ``ids`` at ``url``; return the response."""
    data = {"action": action, "_selected_action": [str(i) for i in ids], "index": "0", **extra}
    return client.post(url, data)


def process_alive(pid: int) -> bool:
    """Return whether process ``pid`` still runs (a zombie, exited but not reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


@contextmanager
def running_worker(queues, **kwargs):
    """Run a worker in a thread for the block; fail if its loop raised, broke or did not stop."""
    kwargs.setdefault("poll_interval_s", 0.1)
    stop = threading.Event()
    from alkstore_django.worker import Worker

    worker = Worker(queues, **kwargs)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            worker.run(stop)
        except BaseException as exc:  # noqa: BLE001 - reported by the block's end
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        yield worker
    finally:
        stop.set()
        thread.join(15)
    assert not thread.is_alive()
    assert not errors, errors
    assert worker.broken is None, worker.broken


@contextmanager
def waiting_worker(*queues: str, waiting: bool = True) -> Iterator[str]:
    """Hold a live-worker row of ``queues`` for the block, as a worker that waits (or not).

    Producers on PostgreSQL send a queue's wake-up only while one of its
    workers waits (``LiveWorker.waiting``): a test that listens for it with
    no worker running stands one in.
    """
    from alkstore_django import presence

    worker_id = f"test-waiting-{os.getpid()}-{threading.get_ident()}"
    presence.announce(
        ALKSTORE_DB, worker_id, queues=queues, pool="threads", concurrency=1, counts=(0, 0, 0)
    )
    presence.set_waiting(ALKSTORE_DB, worker_id, waiting)
    try:
        yield worker_id
    finally:
        presence.leave(ALKSTORE_DB, worker_id)
