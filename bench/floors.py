"""The floors (issue 27): alkstore's claim, pickup and enqueue beside the raw driver's.

    python -m bench.floors claim N PROCS BATCH   # the fused claim+ack floor
    python -m bench.floors enqueue N             # alkstore's one-row enqueue statement, raw
    python -m bench.floors listen N              # PostgreSQL: the LISTEN pickup floor
    python -m bench.floors listen-handoff N      # the same, each job started by another thread
    python -m bench.floors producers N K MODE [PLACEMENT]
                                                 # PostgreSQL: K producers enqueueing at once
                                                 # (MODE alkstore, alkstore-waiting,
                                                 # alkstore-eager or floor; PLACEMENT free,
                                                 # the default, or apart)

``bench/run.py --workloads floor`` runs them round by round beside alkstore's
own commands (``bench.workloads``) and prints the ratios (``bench/floor_rows.py``).
A floor is what the engine allows through its driver with the least client
work and no queue semantics beyond the claim itself: each command fills and
checks the job table through alkstore (Django, ``bench.settings``: the same
rows as alkstore's figures), and its timed loop runs on a raw psycopg,
sqlite3 or MySQLdb connection built from ``BENCH_DATABASE_URL``; its worker
processes (``claim-worker``, ``listener``) import neither Django nor
alkstore. Each command prints one JSON line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any
from urllib.parse import urlsplit

from bench.peers import common

# Checked against the model by every command that fills it.
TABLE = "alkstore_django_job"
DRAIN_QUEUE = "bench.floor"
LATENCY_QUEUE = "bench.floor-latency"
ENQUEUE_QUEUE = "bench.enqueue"  # bench.workloads' enqueue: the same stamps
PRODUCER_QUEUE = "bench.producers"
CHANNEL = "floor_wake"
# Batch 1 drains at most this many jobs: one commit per job.
BATCH_ONE_JOBS = 3_000
PRODUCER_COUNTS = (1, 2, 4, 8)
# The producers' modes: alkstore's defaults with no worker of the queue
# waiting (each busy, or none running: no notification is sent), the same
# with one waiting (a live-worker row that says so: the coalesced wake-ups,
# one per process per NOTIFY_COALESCE_S), alkstore with a notification on
# every commit (the window at 0: the behaviour before issue 27), and the raw
# statement without one.
MODES = {
    "alkstore": {},
    "alkstore-waiting": {},
    "alkstore-eager": {"BENCH_NOTIFY_COALESCE_S": "0"},
    "floor": {},
}
WAITING_WORKER = "bench-floors-waiting"
# Where the producers run: placed by the scheduler, or all of them on the
# first CPU and their server processes on the second (``bench.placement``).
PRODUCER_PLACEMENTS = ("free", "apart")
PLACEMENT_ENV = "BENCH_PRODUCERS_PLACEMENT"
PRIORITY_ORDER = "ORDER BY priority DESC, run_at, id"
# The fused cycle on PostgreSQL: one prepared statement in autocommit acks
# (deletes) the previous batch and claims the next, as alkstore's claim does,
# without its fences, lapsed-claim sweep, expiry or pause. The acked ids come
# once, on a row of their own, as alkstore's do.
PG_CLAIM = (
    f"WITH acked AS (DELETE FROM {TABLE} WHERE id = ANY(%s::bigint[]) RETURNING id), "
    f"c AS (UPDATE {TABLE} j SET state = 'processing', attempts = j.attempts + 1, "
    "generation = j.generation + 1, worker_id = %s, "
    "claim_expires_at = now() + make_interval(secs => j.visibility_timeout_s) "
    f"WHERE j.id = ANY(ARRAY(SELECT id FROM {TABLE} WHERE queue = %s AND state = 'pending' "
    f"AND run_at <= now() {PRIORITY_ORDER} LIMIT %s FOR UPDATE SKIP LOCKED)) RETURNING j.*) "
    "SELECT a.acked, c.* FROM (SELECT array_agg(id) AS acked FROM acked) AS a "
    "FULL JOIN c ON false"
)
SQLITE_NOW = "strftime('%Y-%m-%d %H:%M:%f', 'now')"
# The unary + keeps run_at out of index selection, as alkstore's claim does,
# so the claim walks alk_job_claim in claim order whatever the statistics.
SQLITE_CLAIM = (
    f"UPDATE {TABLE} SET state = 'processing', attempts = attempts + 1, "
    "generation = generation + 1, worker_id = ?, claim_expires_at = "
    "strftime('%Y-%m-%d %H:%M:%f', 'now', printf('%+.3f seconds', visibility_timeout_s)) "
    f"WHERE id IN (SELECT id FROM {TABLE} WHERE queue = ? AND state = 'pending' "
    f"AND +run_at <= {SQLITE_NOW} {PRIORITY_ORDER} LIMIT ?) RETURNING *"
)
# Forced as alkstore forces it: another index would lock rows it then skips.
MARIADB_CLAIM = (
    f"SELECT * FROM {TABLE} FORCE INDEX (alk_job_claim) WHERE queue = %s "
    f"AND state = 'pending' AND run_at <= UTC_TIMESTAMP(6) {PRIORITY_ORDER} LIMIT %s "
    "FOR UPDATE SKIP LOCKED"
)
MARIADB_MARK = (
    f"UPDATE {TABLE} SET state = 'processing', attempts = attempts + 1, "
    "generation = generation + 1, worker_id = %s, claim_expires_at = "
    "TIMESTAMPADD(MICROSECOND, ROUND(visibility_timeout_s * 1000000), UTC_TIMESTAMP(6)) "
    "WHERE id IN ({ids})"
)
# InnoDB's lock races (deadlock, lock-wait timeout): the cycle runs again, as alkstore's.
MARIADB_RETRY = (1213, 1205)


def engine() -> str:
    scheme = urlsplit(os.environ["BENCH_DATABASE_URL"]).scheme
    return {"sqlite": "sqlite", "mysql": "mariadb"}.get(scheme, "postgresql")


def connect() -> Any:
    """A raw driver connection to the bench database in autocommit, outside Django.

    MariaDB's runs READ COMMITTED, as Django's (and so alkstore's) do.
    """
    kind = engine()
    if kind == "postgresql":
        from bench.peers.floor import connect as pg_connect

        return pg_connect()
    from bench.settings import database_from_url

    db: dict[str, Any] = database_from_url(os.environ["BENCH_DATABASE_URL"])
    if kind == "sqlite":
        import sqlite3

        # No implicit transactions: a claim cycle opens its own BEGIN IMMEDIATE.
        return sqlite3.connect(db["NAME"], timeout=30, isolation_level=None)
    import MySQLdb

    conn = MySQLdb.connect(
        host=db["HOST"] or "127.0.0.1",
        port=int(db["PORT"] or 3306),
        user=db["USER"],
        password=db["PASSWORD"],
        database=db["NAME"],
        charset="utf8mb4",
        autocommit=True,
    )
    conn.cursor().execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    return conn


def runner(conn: Any) -> Callable[[str, list[Any]], list[tuple[Any, ...]]]:
    """Run one statement on one kept cursor (prepared on PostgreSQL) and fetch its rows."""
    cursor = conn.cursor()
    if engine() == "postgresql":
        return lambda sql, params: cursor.execute(sql, params, prepare=True).fetchall()

    def run(sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
        cursor.execute(sql, params)
        return list(cursor.fetchall())

    return run


class Claim:
    """The fused claim+ack cycle on a raw connection: ack ``acks``, claim up to ``n`` jobs.

    Returns the claimed rows (every job column; ``columns`` names them once a
    cycle has run). One statement on PostgreSQL; one ``BEGIN IMMEDIATE``
    transaction on SQLite (delete, ``UPDATE … RETURNING``); one transaction
    on MariaDB, which has no ``UPDATE … RETURNING`` (delete, ``SELECT … FOR
    UPDATE SKIP LOCKED``, ``UPDATE`` by id).
    """

    def __init__(self, conn: Any, n: int, queue: str) -> None:
        self.conn, self.n, self.queue = conn, n, queue
        self.worker_id = f"floor:{os.getpid()}"
        self.kind = engine()
        self.cursor = conn.cursor()
        self.columns: list[str] = []
        self.retries = 0
        if self.kind == "mariadb":
            conn.autocommit(False)

    def __call__(self, acks: list[int]) -> list[tuple[Any, ...]]:
        if self.kind == "postgresql":
            params = [acks, self.worker_id, self.queue, self.n]
            rows = self.cursor.execute(PG_CLAIM, params, prepare=True).fetchall()
            self._name_columns(1)
            return [row[1:] for row in rows if row[1] is not None]
        if self.kind == "sqlite":
            return self._sqlite(acks)
        import MySQLdb

        while True:
            try:
                return self._mariadb(acks)
            except MySQLdb.OperationalError as exc:
                self.conn.rollback()
                if exc.args[0] not in MARIADB_RETRY:
                    raise
                self.retries += 1

    def _name_columns(self, skip: int) -> None:
        if not self.columns and self.cursor.description:
            self.columns = [column[0] for column in self.cursor.description[skip:]]

    def _sqlite(self, acks: list[int]) -> list[tuple[Any, ...]]:
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            if acks:
                conn.execute(
                    f"DELETE FROM {TABLE} WHERE id IN ({', '.join('?' * len(acks))})", acks
                )
            rows = self.cursor.execute(
                SQLITE_CLAIM, [self.worker_id, self.queue, self.n]
            ).fetchall()
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        self._name_columns(0)
        return rows

    def _mariadb(self, acks: list[int]) -> list[tuple[Any, ...]]:
        cursor = self.cursor
        if acks:
            cursor.execute(
                f"DELETE FROM {TABLE} WHERE id IN ({', '.join(['%s'] * len(acks))})", acks
            )
        cursor.execute(MARIADB_CLAIM, [self.queue, self.n])
        rows = list(cursor.fetchall())
        self._name_columns(0)
        if rows:
            ids = [row[self.columns.index("id")] for row in rows]
            cursor.execute(
                MARIADB_MARK.format(ids=", ".join(["%s"] * len(ids))), [self.worker_id, *ids]
            )
        self.conn.commit()
        return rows


# --- the floors' processes ------------------------------------------------------------


def claim_worker(batch: str) -> dict:
    """One floor worker: claim ``batch`` jobs a cycle, acking the last ones, until none is left.

    Marks its first claimed batch (``common.mark_first``) as alkstore's
    worker marks its first handler start, and the return of the cycle that
    claims nothing, which acks the last batch (``common.mark_last``).
    """
    claim = Claim(connect(), int(batch), DRAIN_QUEUE)
    held: list[int] = []
    done = 0
    while rows := claim(held):
        common.mark_first()
        at = claim.columns.index("id")
        held = [row[at] for row in rows]
        done += len(held)
    common.mark_last()
    return {"done": done, "retries": claim.retries}


def listener(handoff: str = "") -> None:
    """The pickup floor's worker (PostgreSQL): LISTEN, then claim on the same connection.

    After each notification it runs the fused claim (batch 1) until it claims
    nothing (the last, empty, cycle acks), stamping each job's ``i`` once its
    row is back. Notifications that arrive during a claim wait in psycopg's
    backlog for the next ``notifies()``. Runs until SIGTERM.

    With ``handoff`` each claimed job is stamped by a second thread, woken
    through a ``SimpleQueue``: the one hop that a worker running its handlers
    beside its listener cannot leave out, and nothing else of alkstore's.
    """
    conn = connect()
    conn.execute(f"LISTEN {CHANNEL}")
    claim = Claim(conn, 1, LATENCY_QUEUE)
    start: Callable[[int], None] = common.mark_job
    if handoff:
        started: SimpleQueue[int] = SimpleQueue()

        def starter() -> None:
            while True:
                common.mark_job(started.get())

        threading.Thread(target=starter, daemon=True).start()
        start = started.put
    held: list[int] = []
    while True:
        for _ in conn.notifies(stop_after=1):
            pass
        while rows := claim(held):
            for row in rows:
                start(row[claim.columns.index("payload")]["i"])
            held = [row[claim.columns.index("id")] for row in rows]
        held = []


def producer(mode: str, count: str, index: str) -> dict:
    """One of ``producers``' processes: set up, say ready, wait for go, enqueue ``count`` jobs."""
    from bench.workloads import setup

    setup()
    from alkstore_django import store

    if mode == "floor":
        conn, one = raw_enqueuer(PRODUCER_QUEUE, p=int(index))
    else:
        q = store.queue(PRODUCER_QUEUE)

        def one(i: int) -> None:
            q.enqueue({"p": int(index), "i": i})

    one(-1)
    if os.environ.get(PLACEMENT_ENV) == "apart":
        from django.db import connections

        from bench.placement import place

        raw = conn if mode == "floor" else connections[store.using].connection
        place("apart", [raw.info.backend_pid], sorted(os.sched_getaffinity(0)))
    print("ready", flush=True)
    sys.stdin.readline()
    started, cpu = time.monotonic(), time.process_time()
    for i in range(int(count)):
        one(i)
    ended = time.monotonic()
    return {"start": started, "end": ended, "jobs": int(count), "cpu": time.process_time() - cpu}


# --- the commands bench/run.py runs ------------------------------------------------------


def prepare() -> None:
    """Set Django up and empty the job tables (``bench.workloads.clear``)."""
    from bench.workloads import clear, setup

    setup()
    from alkstore_django.models import Job

    assert Job._meta.db_table == TABLE, Job._meta.db_table
    clear()


def live(queue: str) -> int:
    """The rows of ``queue`` left in the job table (Django's connection closed after)."""
    from django.db import connections

    from alkstore_django.models import Job

    count = Job.objects.filter(queue=queue).count()
    connections.close_all()
    return count


def enqueue_statement(queue: str, channel: str = "") -> tuple[str, Callable[[str], list[Any]]]:
    """alkstore's own one-row enqueue for ``queue``, as the raw driver takes it, and its params.

    PostgreSQL's is the dialect's prepared statement (with ``pg_notify`` on
    ``channel`` when given, else none); SQLite's the dialect's INSERT over
    ``json_each``, its marks turned to qmarks as the dialect turns them;
    MariaDB's the dialect's row with ``RETURNING id``. The params come from
    the queue handle's plain stamps.
    """
    from alkstore_django import store

    dialect: Any = store.dialect
    stamps = store.queue(queue)._plain
    if dialect.vendor == "postgresql":
        from alkstore_django.dialects.postgresql.dialect import _enqueue_sql

        when, shared = dialect._stamp_values(stamps)
        sql = _enqueue_sql(
            True, when, stamps.expires_s is not None, "always" if channel else "none"
        )
        tail = [channel] if channel else []
        return sql, lambda payload: [queue, payload, *shared, *tail]
    if dialect.vendor == "sqlite":
        sql, shared = dialect._insert_sql(stamps, "value", "")
        from alkstore_django.dialects.sqlite.dialect import qmarks

        sql = qmarks(f"{sql}RETURNING id")
        return sql, lambda payload: [*shared, json.dumps([payload])]
    from alkstore_django.dialects.base import ENQUEUE_COLUMNS

    values, shared = dialect._row_sql(stamps)
    sql = f"INSERT INTO {TABLE} ({ENQUEUE_COLUMNS}) VALUES (%s, %s, {values}) RETURNING id"
    return sql, lambda payload: [queue, payload, *shared]


def raw_enqueuer(
    queue: str, channel: str = "", **payload: int
) -> tuple[Any, Callable[[int], None]]:
    """A raw connection, and a function enqueueing job ``i`` on it by ``enqueue_statement``.

    Job ``i``'s payload is ``payload`` with ``"i": i``, encoded as alkstore's codec does.
    """
    sql, params = enqueue_statement(queue, channel)
    conn = connect()
    run = runner(conn)

    def one(i: int) -> None:
        run(sql, params(json.dumps({**payload, "i": i})))

    return conn, one


def cmd_claim(n: str, procs: str, batch: str) -> dict:
    """The fused claim+ack floor: ``n`` no-op jobs drained by ``procs`` raw workers.

    The jobs are alkstore's (``enqueue_many`` of ``None``, a thousand at a
    time, as ``bench.workloads drain`` fills them). ``common.drain`` times
    the workers as ``cmd_drain`` does alkstore's (first claim in any process
    to the last exit; CPU from ``wait4``) and checks that no row of the
    queue is left.
    """
    from django.db import connections

    from alkstore_django import store
    from bench.workloads import enqueue_noops

    prepare()
    enqueue_noops(store.queue(DRAIN_QUEUE), int(n))
    connections.close_all()
    worker = [sys.executable, "-m", "bench.floors", "claim-worker", batch]
    result = common.drain(worker, int(n), int(procs), lambda: live(DRAIN_QUEUE))
    return {**result, "batch": int(batch)}


def cmd_enqueue(n: str) -> dict:
    """alkstore's one-row enqueue statement, without a notification, one by one in autocommit."""
    from django.db import connections

    prepare()
    conn, one = raw_enqueuer(ENQUEUE_QUEUE)
    connections.close_all()
    result = common.timed_enqueue(int(n), 0, one, None)
    conn.close()
    if (left := live(ENQUEUE_QUEUE)) != int(n) + 1:
        raise SystemExit(f"enqueue floor wrote {left} rows, not {int(n) + 1}")
    return result


def cmd_listen(n: str, handoff: str = "") -> dict:
    """The LISTEN pickup floor (PostgreSQL): ``common.latency``, as the peers are timed.

    ``handoff``: the listener starts each job in a second thread (``listener``).

    The producer is this process: alkstore's one-row statement with
    ``pg_notify`` in it, prepared, in autocommit, on a raw connection; the
    commit is stamped when it returns.
    """
    from django.db import connections

    prepare()
    conn, one = raw_enqueuer(LATENCY_QUEUE, CHANNEL)
    connections.close_all()
    worker = [sys.executable, "-m", "bench.floors", "listener", *([handoff] if handoff else [])]
    try:
        return common.latency(worker, one, int(n))
    finally:
        conn.close()


def cmd_producers(n: str, k: str, mode: str, placement: str = "free") -> dict:
    """``k`` processes enqueueing ``n`` jobs between them one by one, started together.

    Each child sets up (Django, its connection, one enqueue), says ``ready``
    and waits for ``go``; the rate is the jobs over the span from the first
    child's start to the last one's end (CLOCK_MONOTONIC is the machine's).
    ``cpu_us_per_job`` is the producers' own CPU over their loops, per job:
    on a machine with fewer cores than producers and backends, what the
    client spends is taken from the server.

    ``placement`` ``apart`` puts every producer on the machine's first CPU
    and each one's server process on the second, once it is connected (as
    ``bench.placement`` does; a local PostgreSQL and root): the server then
    has a core the clients never take, so the rate says what the server
    allows each side's statements, as where the web processes run on hosts
    of their own.
    """
    from bench.placement import cannot_place
    from bench.workloads import ROOT

    if placement not in PRODUCER_PLACEMENTS:
        raise SystemExit(
            f"Invalid placement {placement!r}: expected one of {', '.join(PRODUCER_PLACEMENTS)}."
        )
    if placement == "apart" and (refused := cannot_place(os.environ["BENCH_DATABASE_URL"])):
        raise SystemExit(refused)
    prepare()
    from alkstore_django import presence
    from alkstore_django.conf import app_settings

    using = app_settings.database
    presence.leave(using, WAITING_WORKER)
    if mode == "alkstore-waiting":
        presence.announce(
            using, WAITING_WORKER, queues=[PRODUCER_QUEUE], pool="threads", concurrency=1,
            counts=(0, 0, 0),
        )  # fmt: skip
    jobs, producers = int(n), int(k)
    env = {**os.environ, **MODES[mode], PLACEMENT_ENV: placement}
    children = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.floors", "producer", mode, str(count), str(index)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )
        for index, count in enumerate(
            jobs // producers + (index < jobs % producers) for index in range(producers)
        )
    ]
    try:
        for child in children:
            assert child.stdout is not None
            if child.stdout.readline().strip() != "ready":
                raise SystemExit(f"producer {child.pid} never got ready")
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        outputs = [child.communicate(timeout=600)[0] for child in children]
    finally:
        presence.leave(using, WAITING_WORKER)
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    if any(child.returncode for child in children):
        raise SystemExit(f"producers exited {[child.returncode for child in children]}")
    spans = [json.loads(output.strip().splitlines()[-1]) for output in outputs]
    if (left := live(PRODUCER_QUEUE)) != jobs + producers:
        raise SystemExit(f"{producers} producers wrote {left} rows, not {jobs + producers}")
    seconds = max(s["end"] for s in spans) - min(s["start"] for s in spans)
    cpu_us = sum(s["cpu"] for s in spans) / jobs * 1e6
    return {
        "jobs": jobs, "producers": producers, "mode": mode, "placement": placement,
        "rate": jobs / seconds,
        "cpu_us_per_job": cpu_us,
    }  # fmt: skip


if __name__ == "__main__":
    common.main(
        {
            "claim": cmd_claim,
            "enqueue": cmd_enqueue,
            "listen": cmd_listen,
            "listen-handoff": lambda n: cmd_listen(n, "handoff"),
            "producers": cmd_producers,
            "claim-worker": claim_worker,
            "listener": listener,  # type: ignore[dict-item]
            "producer": producer,
        }
    )
