"""SQLite: claims and moves inside one ``BEGIN IMMEDIATE`` write transaction.

A deferred transaction that reads before it writes can fail with
``SQLITE_BUSY_SNAPSHOT`` no matter the busy timeout, so every multi-statement
change here takes the write lock up front. The clock is read once per
transaction and passed as a value, so every statement in it agrees on "now".
SQLite has no NOTIFY: wake-ups come from watching ``PRAGMA data_version``,
which changes whenever another connection commits.
"""

from __future__ import annotations

import functools
import json
import re
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from django.core import checks
from django.db import transaction
from django.utils.dateparse import parse_datetime

from ...conf import app_settings
from ...records import EnqueueStamps
from ...records import Job as JobRecord
from ..base import (
    DEAD_COLUMNS,
    DEAD_COPY,
    DEAD_TABLE,
    ENQUEUE_COLUMNS,
    JOB_SELECT,
    JOB_TABLE,
    MESSAGE_TABLE,
    OUTCOME_TABLE,
    REQUEUE_COLUMNS,
    REQUEUE_SELECT,
    STAMP_MARKS,
    Dialect,
    Watcher,
)
from ..cancels import CancelStatements
from ..claims import ClaimStatements
from ..controls import PAUSED, ControlStatements
from ..driver import ensure_open
from ..leases import LeaseStatements
from ..operators import OperatorStatements
from ..schedules import ScheduleStatements
from ..unique import UniqueJobs
from ..upserts import OnConflictUpserts
from .watch import SqliteWatcher

FORMAT = "'%%Y-%%m-%%d %%H:%%M:%%f'"
NOW = f"strftime({FORMAT}, 'now')"
MESSAGE_TAIL = 10_000
# A ``%s`` mark, not an escaped ``%%s``: the rule Django's SQLite cursor turns them by.
_MARK = re.compile(r"(?<!%)%s")


@functools.lru_cache(maxsize=64)
def qmarks(sql: str) -> str:
    """Return ``sql`` with its ``%s`` marks as sqlite3's ``?``, as Django's cursor turns them.

    Once per statement's text, where Django's cursor runs its regular
    expression over the whole text at every call.
    """
    return _MARK.sub("?", sql).replace("%%", "%")


class SqliteDialect(
    ClaimStatements,
    CancelStatements,
    UniqueJobs,
    ControlStatements,
    OperatorStatements,
    LeaseStatements,
    ScheduleStatements,
    OnConflictUpserts,
    Dialect,
):
    """SQLite 3.35+ in WAL mode: one writer at a time, readers never blocked."""

    vendor = "sqlite"
    supports_update_returning = True
    # The write transaction's lock already serializes every claim.
    row_lock_sql = ""

    def __init__(self, using: str) -> None:
        super().__init__(using)
        self._kept = threading.local()  # each thread's cursor (``_fetch_kept``)

    @classmethod
    def check_settings(cls, alias: str, config: dict[str, Any]) -> list[checks.CheckMessage]:
        """Warn when a read-then-write transaction could fail with "database is locked".

        A deferred transaction that reads before it writes cannot wait for the
        write lock (SQLITE_BUSY_SNAPSHOT), so an enqueue inside such a block can
        fail under load whatever the timeout.
        """
        mode = str(config.get("OPTIONS", {}).get("transaction_mode", "")).upper()
        if mode == "IMMEDIATE":
            return []
        return [
            checks.Warning(
                f"DATABASES[{alias!r}] is SQLite without transaction_mode 'IMMEDIATE'.",
                hint=(
                    'Set "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20} so '
                    "several processes can share the file without 'database is locked'."
                ),
                obj="settings.DATABASES",
                id="alkstore.W001",
            )
        ]

    @classmethod
    def prepare_connection(cls, connection: Any) -> None:
        """Put a new connection's file in WAL mode so readers never block the writer.

        WAL is a property of the file; asking again on every connection is cheap and
        keeps a site that never configured it safe with several worker processes.
        """
        name = str(connection.settings_dict.get("NAME", ""))
        if not name or name == ":memory:" or "mode=memory" in name:
            return
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA journal_mode=WAL")

    @contextmanager
    def write_transaction(self) -> Iterator[Any]:
        connection = self.connection
        if connection.in_atomic_block:
            # Inside the caller's transaction we join it, as enqueue does.
            with connection.cursor() as cursor:
                yield cursor
            return
        connection.ensure_connection()
        with connection.cursor() as cursor:
            cursor.execute("BEGIN IMMEDIATE", [])
            try:
                yield cursor
            except BaseException:
                cursor.execute("ROLLBACK", [])
                raise
            cursor.execute("COMMIT", [])

    @contextmanager
    def atomic_write(self) -> Iterator[None]:
        """Django's ``atomic()``, begun ``IMMEDIATE`` whatever ``transaction_mode`` says.

        For a write transaction with ORM calls in it (a requeue that resumes
        workflow steps, a cancel): those open ``atomic()`` blocks of their own,
        which the raw ``BEGIN IMMEDIATE`` of ``write_transaction`` would not
        let them join. Django reads ``transaction_mode`` at each ``BEGIN``.
        """
        connection = self.connection
        if connection.in_atomic_block:
            with transaction.atomic(using=self.using):
                yield
            return
        connection.ensure_connection()
        mode = connection.transaction_mode
        connection.transaction_mode = "IMMEDIATE"
        try:
            with transaction.atomic(using=self.using):
                connection.transaction_mode = mode
                yield
        finally:
            connection.transaction_mode = mode

    def now_sql(self) -> tuple[str, list[Any]]:
        return NOW, []

    def plus_sql(self, base: str, seconds: str) -> str:
        return f"strftime({FORMAT}, {base}, printf('%%+.3f seconds', {seconds}))"

    def ids_sql(self, ids: Sequence[int]) -> tuple[str, list[Any]]:
        return "id IN (SELECT value FROM json_each(%s))", [json.dumps([int(i) for i in ids])]

    def open_watcher(
        self,
        channels: Sequence[str],
        *,
        queues: Sequence[str] = (),
        listen_alias: str | None = None,
    ) -> Watcher:
        return SqliteWatcher(self.using, list(channels))

    def to_datetime(self, value: Any) -> datetime | None:
        # Django's converters already parse columns declared as datetime, naive
        # in UTC; computed columns (now, min) arrive as text.
        parsed = value if value is None or isinstance(value, datetime) else parse_datetime(value)
        if parsed is None or parsed.tzinfo is not None:
            return parsed
        return parsed.replace(tzinfo=UTC)

    @staticmethod
    def _read_now(cursor: Any) -> str:
        cursor.execute(f"SELECT {NOW}", [])
        return cursor.fetchone()[0]

    def _insert_sql(self, stamps: EnqueueStamps, payload: str, tail: str) -> tuple[str, list[Any]]:
        """Return the enqueue INSERT over ``json_each(%s)``, each row's payload ``payload``."""
        params: list[Any] = [stamps.queue, stamps.priority]
        if stamps.delay_s is not None:
            run_at_sql = self.plus_sql("'now'", "%s")
            params.append(stamps.delay_s)
        elif stamps.run_at is not None:
            run_at_sql = "%s"
            params.append(self.adapt_datetime(stamps.run_at))
        else:
            run_at_sql = NOW
        params += stamps.stamp_params()
        expires_sql = "NULL"
        if stamps.expires_s is not None:
            expires_sql = self.plus_sql("'now'", "%s")
            params.append(stamps.expires_s)
        key_column, key_value = (
            (", unique_key", ", json_extract(value, '$[1]')") if tail else ("", "")
        )
        sql = (
            f"INSERT INTO {JOB_TABLE} ({ENQUEUE_COLUMNS}{key_column}) "
            f"SELECT %s, {payload}, %s, {run_at_sql}, 0, {STAMP_MARKS}, {expires_sql}, "
            f"'pending', {NOW}{key_value} FROM json_each(%s) WHERE true ORDER BY key {tail}"
        )
        return sql, params

    def enqueue(self, stamps: EnqueueStamps, payloads: Sequence[str]) -> list[int]:
        # One statement over a JSON array of the encoded payloads; SQLite has no
        # NOTIFY, so workers notice the commit by watching the file instead.
        sql, params = self._insert_sql(stamps, "value", "")
        rows = self._fetch_kept(sql + "RETURNING id", [*params, json.dumps(list(payloads))])
        return sorted(row[0] for row in rows)

    def _fetch_kept(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        """Run ``sql`` on this thread's kept cursor of Django's own sqlite3 connection.

        For ``enqueue()``, called once per job by a producer: Django's cursor
        (made anew, its marks turned by a regular expression, its execute
        wrapped three times) cost about an eighth of an enqueue's client CPU
        here (22 of 169 µs, docs/performance.md). The connection, its
        transaction (inside ``atomic()`` the job joins it) and its errors are
        Django's; the statement is not seen by ``execute_wrapper`` hooks, as
        PostgreSQL's prepared enqueue is not. The kept cursor holds only the
        new ids until the next call.
        """
        wrapper = self.connection
        ensure_open(wrapper)
        wrapper.validate_no_broken_transaction()
        raw = wrapper.connection
        cursor = getattr(self._kept, "cursor", None)
        with wrapper.wrap_database_errors:
            if cursor is None or cursor.connection is not raw:
                # Django's reconnect makes a new connection object.
                cursor = self._kept.cursor = raw.cursor()
            cursor.execute(qmarks(sql), params)
            return cursor.fetchall()

    def insert_unique(
        self, cursor: Any, stamps: EnqueueStamps, keyed: dict[str, str]
    ) -> dict[str, int]:
        # Inside the write transaction no other writer runs: the conflict is
        # with a committed live row.
        sql, params = self._insert_sql(
            stamps,
            "json_extract(value, '$[0]')",
            "ON CONFLICT (queue, unique_key) WHERE unique_key IS NOT NULL DO NOTHING ",
        )
        pairs = json.dumps([[payload, key] for key, payload in keyed.items()])
        cursor.execute(sql + "RETURNING unique_key, id", [*params, pairs])
        return dict(cursor.fetchall())

    def claim_and_ack(
        self,
        queue: str,
        worker_id: str,
        n: int,
        ack_worker_id: str,
        fences: Sequence[tuple[int, int]],
    ) -> tuple[list[int], list[JobRecord]]:
        # The acks ride the claim's write transaction: one commit (one WAL
        # sync) per worker cycle instead of two.
        lapsed = "queue = %s AND state = 'processing' AND claim_expires_at <= %s"
        # The unary + keeps run_at out of index selection: otherwise, after ANALYZE,
        # SQLite picks alk_job_due (queue, run_at) and sorts every ready row in a
        # temp b-tree; alk_job_claim walks them already in claim order.
        claim_sql = (
            f"UPDATE {JOB_TABLE} SET state = 'processing', attempts = attempts + 1, "
            "generation = generation + 1, worker_id = %s, "
            f"claim_expires_at = {self.plus_sql('%s', 'visibility_timeout_s')} "
            f"WHERE id IN (SELECT id FROM {JOB_TABLE} WHERE queue = %s AND state = 'pending' "
            "AND +run_at <= %s AND (expires_at IS NULL OR expires_at > %s) "
            f"AND NOT {PAUSED} "
            f"ORDER BY priority DESC, run_at, id LIMIT %s) RETURNING {JOB_SELECT}"
        )
        acked: list[int] = []
        with self.write_transaction() as cursor:
            now = self._read_now(cursor)
            if fences:
                cursor.execute(self._ack_sql("%s"), [self._fence_json(fences), ack_worker_id, now])
                acked = [row[0] for row in cursor.fetchall()]
            self._bury(
                cursor, f"{lapsed} AND attempts >= max_attempts", [queue, now],
                "max attempts exceeded", now,
            )  # fmt: skip
            cursor.execute(
                f"UPDATE {JOB_TABLE} SET state = 'pending', worker_id = NULL, "
                f"claim_expires_at = NULL WHERE {lapsed} AND attempts < max_attempts",
                [queue, now],
            )
            cursor.execute(claim_sql, [worker_id, now, queue, now, now, queue, n])
            rows = cursor.fetchall()
        codec = app_settings.payload_codec
        jobs = [self.job_from_row(row, codec) for row in rows]
        jobs.sort(key=lambda job: (-job.priority, job.run_at, job.id))
        return acked, jobs

    def lock_control(
        self, cursor: Any, queue: str
    ) -> tuple[datetime, bool, datetime | None, int, str | None]:
        # Write before reading: a deferred transaction that reads first cannot
        # wait for the write lock (SQLITE_BUSY_SNAPSHOT).
        cursor.execute(self.ensure_control_sql, [queue])
        return super().lock_control(cursor, queue)

    @staticmethod
    def _bury(cursor: Any, where: str, params: list[Any], error: str, now: str) -> int:
        cursor.execute(
            f"INSERT INTO {DEAD_TABLE} ({DEAD_COLUMNS}) SELECT {DEAD_COPY}, %s, %s "
            f"FROM {JOB_TABLE} WHERE {where}",
            [error, now, *params],
        )
        moved = cursor.rowcount
        if moved:
            cursor.execute(f"DELETE FROM {JOB_TABLE} WHERE {where}", params)
        return moved

    def bury(self, where: str, params: list[Any], error: str) -> int:
        with self.write_transaction() as cursor:
            now = self._read_now(cursor)
            return self._bury(cursor, where.format(now="%s"), [*params, now], error, now)

    def ack_many(self, queue: str, ids: Sequence[int]) -> int:
        match, params = self.ids_sql(ids)
        sql = (
            f"DELETE FROM {JOB_TABLE} WHERE {match} AND queue = %s "
            f"AND state = 'processing' AND claim_expires_at > {NOW}"
        )
        return self._rowcount(sql, [*params, queue])

    @staticmethod
    def _ack_sql(now: str) -> str:
        return (
            f"DELETE FROM {JOB_TABLE} WHERE (id, generation) IN "
            "(SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') "
            "FROM json_each(%s)) AND worker_id = %s "
            f"AND state = 'processing' AND claim_expires_at > {now} RETURNING id"
        )

    @staticmethod
    def _fence_json(fences: Sequence[tuple[int, int]]) -> str:
        return json.dumps([[job_id, generation] for job_id, generation in fences])

    def ack_fenced(self, worker_id: str, fences: Sequence[tuple[int, int]]) -> list[int]:
        with self.connection.cursor() as cursor:
            cursor.execute(self._ack_sql(NOW), [self._fence_json(fences), worker_id])
            return [row[0] for row in cursor.fetchall()]

    def notify(self, channel: str, payload: str) -> None:
        with self.connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {MESSAGE_TABLE} (channel, payload, created_at) "
                f"VALUES (%s, %s, {NOW})",
                [channel, payload],
            )
            # Listeners read only what arrives while they watch: keep a short tail.
            cursor.execute(
                f"DELETE FROM {MESSAGE_TABLE} WHERE id <= %s - {MESSAGE_TAIL}", [cursor.lastrowid]
            )

    # --- operators --------------------------------------------------------------------

    def move_dead_to_live(self, cursor: Any, ids: Sequence[int]) -> dict[str, int]:
        # Inside the caller's write transaction: copy, then delete the same rows.
        match, params = self.ids_sql(ids)
        cursor.execute(
            f"SELECT queue, count(*) FROM {DEAD_TABLE} WHERE {match} GROUP BY queue", params
        )
        moved = {queue: int(n) for queue, n in cursor.fetchall()}
        if moved:
            now = self._read_now(cursor)
            select = REQUEUE_SELECT.format(now="%s")
            cursor.execute(
                f"INSERT INTO {JOB_TABLE} ({REQUEUE_COLUMNS}) SELECT {select} FROM {DEAD_TABLE} "
                f"WHERE {match}",
                [now, now, *params],
            )
            cursor.execute(f"DELETE FROM {DEAD_TABLE} WHERE {match}", params)
        return moved

    def record_outcomes(self, rows: Sequence[tuple[str, int, int, int]]) -> None:
        # "WHERE true" keeps SQLite's parser from reading ON CONFLICT as a join clause.
        sql = (
            f"INSERT INTO {OUTCOME_TABLE} (queue, minute, acked, retried, dead) "
            "SELECT json_extract(value, '$[0]'), strftime('%%Y-%%m-%%d %%H:%%M:00', 'now'), "
            "json_extract(value, '$[1]'), json_extract(value, '$[2]'), "
            "json_extract(value, '$[3]') FROM json_each(%s) WHERE true "
            "ON CONFLICT (queue, minute) DO UPDATE SET acked = acked + excluded.acked, "
            "retried = retried + excluded.retried, dead = dead + excluded.dead"
        )
        self._rowcount(sql, [json.dumps([list(row) for row in rows])])
