"""The database side of the chaos suite: dropped listeners, held write locks, shared files.

Scenario 3 terminates the workers' LISTEN connection over and over
(PostgreSQL only: SQLite has no listener connection; its sibling truncates
the write-ahead log under the file watch instead). Scenario 8 has four
processes enqueue and drain one queue at once (both engines; on SQLite they
share one file). The SQLite sibling of scenario 2 holds the write lock for
seconds at a time, which is what an outage looks like to a file database.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time

import pytest
from django.db import connection

from alkstore_django import store
from tests.chaos.harness import account, drained, settle
from tests.helpers import VENDOR, listener_pids, postgres_only, sqlite_only, wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.django_db(transaction=True)]

postgres_listener = postgres_only(
    "SQLite and MariaDB have no LISTEN connection to terminate; "
    "SQLite's wake-ups watch the file (see the WAL-truncation sibling), MariaDB's watcher "
    "reconnect is pinned in tests/contract/test_mysql.py"
)
sqlite_file = sqlite_only(
    "pins the file database's own behaviour (the servers have no WAL "
    "file under a watcher and no database-wide write lock)"
)


def trickle(seconds: float, every_s: float, fault) -> tuple[list[int], int]:
    """Enqueue a few jobs every ``every_s`` for ``seconds``, calling ``fault()`` each time."""
    queue = store.queue("chaos.work", visibility_timeout_s=5, max_attempts=20, retry_base_s=1)
    ids: list[int] = []
    faults = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        faults += fault()
        ids += queue.enqueue_many([{"work_ms": 1}] * 5)
        time.sleep(every_s)
    return ids, faults


@postgres_listener
@pytest.mark.timeout(120)
def test_listener_terminated_repeatedly__pickup_continues(fleet, report, chaos_long):
    """Scenario 3: ``pg_terminate_backend`` on the LISTEN backends every half second."""
    started = time.monotonic()
    workers = [fleet.start_worker(f"listen-w{i}", ["chaos.work"], concurrency=2) for i in (0, 1)]
    assert wait_for(lambda: all(w.ready() for w in workers), 60), fleet.tail()
    assert wait_for(lambda: len(listener_pids()) >= 2, 30), fleet.tail()

    def terminate() -> int:
        pids = listener_pids()
        with connection.cursor() as cursor:
            for pid in pids:
                cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        return len(pids)

    ids, terminated = trickle(120 if chaos_long else 8, 0.5, terminate)
    assert wait_for(drained(["chaos.work"]), 60), fleet.tail()
    fleet.stop_all_cleanly()
    reconnects = fleet.logs().count("listener reconnected")
    figures = account("3 listener terminated", VENDOR, ids, fleet)
    figures.restarts = terminated
    figures.notes = {"listener_backends_terminated": terminated, "reconnects": reconnects}
    settle(figures, fleet, started, report)
    assert terminated >= 4
    assert reconnects >= 2
    assert figures.acked == len(ids)
    assert figures.double_run == 0


def sqlite_path() -> str:
    return str(connection.settings_dict["NAME"])


@sqlite_file
@pytest.mark.timeout(120)
def test_sqlite__wal_truncated_repeatedly_under_the_file_watch__pickup_continues(
    fleet, report, chaos_long
):
    """Scenario 3's SQLite sibling: ``wal_checkpoint(TRUNCATE)`` every half second."""
    started = time.monotonic()
    workers = [fleet.start_worker(f"wal-w{i}", ["chaos.work"], concurrency=2) for i in (0, 1)]
    assert wait_for(lambda: all(w.ready() for w in workers), 60), fleet.tail()
    other = sqlite3.connect(sqlite_path(), timeout=30, isolation_level=None)

    def truncate() -> int:
        other.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        return 1

    try:
        ids, truncations = trickle(60 if chaos_long else 8, 0.5, truncate)
    finally:
        other.close()
    assert wait_for(drained(["chaos.work"]), 60), fleet.tail()
    fleet.stop_all_cleanly()
    figures = account("3s WAL truncated (SQLite)", VENDOR, ids, fleet)
    figures.restarts = truncations
    figures.notes = {"wal_truncations": truncations}
    settle(figures, fleet, started, report)
    assert figures.acked == len(ids)
    assert figures.double_run == 0


@sqlite_file
@pytest.mark.timeout(150)
def test_sqlite__write_lock_held_for_seconds__workers_and_callers_wait_and_lose_nothing(
    fleet, report, chaos_long
):
    """Scenario 2's SQLite sibling: another process holds the write lock for 2 s at a time.

    A file database has no server to restart; its outage is a writer that
    does not let go (a backup, a long migration). Workers and enqueuers wait
    on the busy timeout and carry on; nothing is lost, no 'database is
    locked' reaches a caller or a log.
    """
    started = time.monotonic()
    queue = store.queue("chaos.work", visibility_timeout_s=10, max_attempts=20, retry_base_s=1)
    ids = queue.enqueue_many([{"work_ms": 2}] * (3000 if chaos_long else 600))
    workers = [fleet.start_worker(f"lock-w{i}", ["chaos.work"]) for i in (0, 1)]
    assert wait_for(lambda: all(w.ready() for w in workers), 60), fleet.tail()
    holds = 0
    blocker = sqlite3.connect(sqlite_path(), timeout=30, isolation_level=None)
    try:
        for _ in range(10 if chaos_long else 3):
            blocker.execute("BEGIN IMMEDIATE")
            holds += 1
            waiter = threading.Thread(target=lambda: ids.append(queue.enqueue({"work_ms": 1})))
            waiter.start()
            time.sleep(2.0)
            blocker.execute("COMMIT")
            waiter.join(30)
            assert not waiter.is_alive()
            time.sleep(1.0)
    finally:
        blocker.close()
    assert wait_for(drained(["chaos.work"]), 90), fleet.tail()
    fleet.stop_all_cleanly()
    assert "locked" not in fleet.logs()
    figures = account("2s write lock held (SQLite)", VENDOR, ids, fleet)
    figures.restarts = holds
    figures.notes = {"write_lock_holds_2s": holds}
    settle(figures, fleet, started, report)
    assert figures.acked == len(ids)


@pytest.mark.timeout(150)
def test_four_processes_enqueue_and_drain_one_queue__nothing_lost_nothing_locked(
    fleet, report, chaos_long, tmp_path
):
    """Scenario 8: four processes enqueue and drain at once (one file, on SQLite)."""
    started = time.monotonic()
    per_process = 2_500 if chaos_long else 250
    names = [f"mix-{i}" for i in range(4)]
    procs = [
        fleet.start(name, ["-m", "tests.chaos.mixer", name, str(per_process), str(tmp_path), "4"])
        for name in names
    ]
    assert wait_for(lambda: len(list(tmp_path.glob("ready-*"))) == 4, 60), fleet.tail()
    (tmp_path / "go").touch()
    assert wait_for(lambda: not any(p.alive() for p in procs), 600 if chaos_long else 120)
    assert [p.popen.returncode for p in procs] == [0] * 4, fleet.tail()
    results = [json.loads(p.log().strip().splitlines()[-1]) for p in procs]
    errors = [e for r in results for e in r["errors"]]
    assert errors == [], errors[:10]
    assert "locked" not in fleet.logs()
    enqueued = [i for r in results for i in r["enqueued"]]
    acked = [i for r in results for i in r["acked"]]
    assert len(enqueued) == 4 * per_process == len(set(enqueued))
    assert sorted(acked) == sorted(enqueued)  # each acked once, by one process
    figures = account("8 concurrent enqueue+drain", VENDOR, enqueued, fleet)
    figures.notes = {"processes": 4, "refused_acks": sum(len(r["refused"]) for r in results)}
    settle(figures, fleet, started, report)
    assert figures.acked == len(enqueued)
    assert figures.double_run == 0
