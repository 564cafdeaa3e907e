"""Operators' SQL: dead-letter moves, the queue overview, schedule toggles, outcome counters.

Kept beside ``base.py`` rather than in it so the operator paths stay readable
on their own; the vendor parts are the two subclasses at the bottom. Every
timestamp is the database's clock (``Dialect.now_sql()``), never the app
server's. Lists of ids travel as one parameter (a PostgreSQL array, a JSON
array on SQLite), so a statement's text does not grow with the selection.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ..models import OutcomeMinute, Schedule
from . import dialect_for
from .base import D, Dialect, J

S = Schedule._meta.db_table
O = OutcomeMinute._meta.db_table  # noqa: E741

# What a dead letter becomes when it is requeued: the same id and stamps,
# pending, due now, attempts reset, its last error kept for the operator.
# An expiry that has already passed is dropped: a requeued job is meant to run.
REQUEUE_COLUMNS = (
    "id, queue, payload, priority, run_at, attempts, max_attempts, visibility_timeout_s, "
    "retry_base_s, expires_at, state, worker_id, claim_expires_at, last_error, enqueued_at, "
    "generation"
)
REQUEUE_SELECT = (
    "id, queue, payload, priority, {now}, 0, max_attempts, visibility_timeout_s, "
    "retry_base_s, CASE WHEN expires_at > {now} THEN expires_at END, 'pending', NULL, NULL, "
    "last_error, enqueued_at, generation"
)


class MaintenanceSQL:
    """The operator statements for one database alias."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect

    @property
    def connection(self) -> Any:
        return self.dialect.connection

    # --- vendor hooks ---------------------------------------------------------

    def ids_sql(self) -> str:
        """Return SQL matching ``id`` against one parameter holding a list of ids."""
        raise NotImplementedError

    def ids_param(self, ids: Sequence[int]) -> Any:
        raise NotImplementedError

    def move_dead_to_live(self, cursor: Any, ids: Sequence[int]) -> dict[str, int]:
        """Requeue the dead letters ``ids``; return how many moved per queue."""
        raise NotImplementedError

    def next_boundary_sql(self, now: str) -> str:
        """Return SQL for each schedule's first ``interval_s`` boundary after ``now``."""
        raise NotImplementedError

    def record_outcomes(self, rows: Sequence[tuple[str, int, int, int]]) -> None:
        raise NotImplementedError

    # --- dead letters ---------------------------------------------------------

    def dead_ids(self, queue: str, after_id: int, limit: int) -> list[int]:
        """Return up to ``limit`` ids of ``queue``'s dead letters above ``after_id``, ascending."""
        with self.connection.cursor() as cursor:
            cursor.execute(
                f"SELECT id FROM {D} WHERE queue = %s AND id > %s ORDER BY id LIMIT %s",
                [queue, after_id, limit],
            )
            return [row[0] for row in cursor.fetchall()]

    def dead_queues(self) -> list[str]:
        """Return the queues that have dead letters, sorted.

        A loose index scan: one probe of the (queue, died_at) index per queue,
        instead of reading every dead letter as ``SELECT DISTINCT`` would.
        """
        sql = (
            f"WITH RECURSIVE q(queue) AS (SELECT min(queue) FROM {D} UNION ALL "
            f"SELECT (SELECT min(queue) FROM {D} WHERE queue > q.queue) FROM q "
            "WHERE q.queue IS NOT NULL) SELECT queue FROM q WHERE queue IS NOT NULL"
        )
        with self.connection.cursor() as cursor:
            cursor.execute(sql, [])
            return [row[0] for row in cursor.fetchall()]

    def delete_dead(self, ids: Sequence[int], queue: str | None = None) -> int:
        """Delete the dead letters ``ids`` (of ``queue`` only, when given); return the count."""
        sql = f"DELETE FROM {D} WHERE {self.ids_sql()}"
        params = [self.ids_param(ids)]
        if queue is not None:
            sql += " AND queue = %s"
            params.append(queue)
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.rowcount

    def purge_dead_batch(self, queue: str, cutoff: datetime, limit: int) -> int:
        """Delete up to ``limit`` of ``queue``'s dead letters that died at or before ``cutoff``.

        The inner select walks the (queue, died_at) index, oldest first.
        """
        sql = (
            f"DELETE FROM {D} WHERE id IN (SELECT id FROM {D} WHERE queue = %s "
            "AND died_at <= %s ORDER BY died_at LIMIT %s)"
        )
        with self.connection.cursor() as cursor:
            cursor.execute(sql, [queue, self.dialect.adapt_datetime(cutoff), limit])
            return cursor.rowcount

    # --- the overview ---------------------------------------------------------

    def overview(self, now: datetime) -> dict[str, dict[str, Any]]:
        """Return per-queue counts as of ``now`` from three grouped, index-served queries."""
        at = self.dialect.adapt_datetime(now)
        stats: dict[str, dict[str, Any]] = {}

        def row_for(queue: str) -> dict[str, Any]:
            return stats.setdefault(
                queue,
                {"pending": 0, "scheduled": 0, "processing": 0, "overdue": 0, "dead": 0,
                 "oldest_pending_at": None},
            )  # fmt: skip

        with self.connection.cursor() as cursor:
            cursor.execute(
                "SELECT queue, sum(CASE WHEN run_at <= %s THEN 1 ELSE 0 END), "
                "sum(CASE WHEN run_at > %s THEN 1 ELSE 0 END), "
                f"min(CASE WHEN run_at <= %s THEN run_at END) FROM {J} "
                "WHERE state = 'pending' GROUP BY queue",
                [at, at, at],
            )
            for queue, ready, scheduled, oldest in cursor.fetchall():
                row = row_for(queue)
                row["pending"], row["scheduled"] = int(ready or 0), int(scheduled or 0)
                row["oldest_pending_at"] = self.dialect.to_datetime(oldest)
            cursor.execute(
                "SELECT queue, count(*), sum(CASE WHEN claim_expires_at <= %s THEN 1 ELSE 0 END) "
                f"FROM {J} WHERE state = 'processing' GROUP BY queue",
                [at],
            )
            for queue, processing, overdue in cursor.fetchall():
                row = row_for(queue)
                row["processing"], row["overdue"] = int(processing), int(overdue or 0)
            cursor.execute(f"SELECT queue, count(*) FROM {D} GROUP BY queue", [])
            for queue, dead in cursor.fetchall():
                row_for(queue)["dead"] = int(dead)
        return stats

    # --- schedules ------------------------------------------------------------

    def set_schedules_enabled(self, ids: Sequence[int], enabled: bool) -> int:
        """Pause or resume schedules; return how many rows changed.

        Resuming moves a ``next_run_at`` that passed while paused to the first
        boundary after now, so a long pause is not replayed as a burst of fires.
        """
        now, now_params = self.dialect.now_sql()
        if enabled:
            sets = (
                f"enabled = %s, updated_at = {now}, next_run_at = CASE WHEN next_run_at <= {now} "
                f"THEN {self.next_boundary_sql(now)} ELSE next_run_at END"
            )
            params = [True, *now_params, *now_params, *now_params]
        else:
            sets = f"enabled = %s, updated_at = {now}"
            params = [False, *now_params]
        sql = f"UPDATE {S} SET {sets} WHERE {self.ids_sql()} AND enabled = %s"
        with self.connection.cursor() as cursor:
            cursor.execute(sql, [*params, self.ids_param(ids), not enabled])
            return cursor.rowcount

    # --- outcomes -------------------------------------------------------------

    def prune_outcomes(self, keep_s: float) -> int:
        """Delete outcome counters older than ``keep_s`` seconds; return the count."""
        now, now_params = self.dialect.now_sql()
        sql = f"DELETE FROM {O} WHERE minute < {self.dialect.plus_sql(now, '%s')}"
        with self.connection.cursor() as cursor:
            cursor.execute(sql, [*now_params, -keep_s])
            return cursor.rowcount


class PostgresMaintenanceSQL(MaintenanceSQL):
    def ids_sql(self) -> str:
        return "id = ANY(%s::bigint[])"

    def ids_param(self, ids: Sequence[int]) -> Any:
        return list(ids)

    def move_dead_to_live(self, cursor: Any, ids: Sequence[int]) -> dict[str, int]:
        # One statement: the rows leave the dead letters and arrive live together.
        now, _ = self.dialect.now_sql()
        sql = (
            f"WITH moved AS (DELETE FROM {D} WHERE id = ANY(%s::bigint[]) RETURNING *), "
            f"ins AS (INSERT INTO {J} ({REQUEUE_COLUMNS}) "
            f"SELECT {REQUEUE_SELECT.format(now=now)} FROM moved RETURNING queue) "
            "SELECT queue, count(*) FROM ins GROUP BY queue"
        )
        cursor.execute(sql, [list(ids)])
        return {queue: int(n) for queue, n in cursor.fetchall()}

    def next_boundary_sql(self, now: str) -> str:
        return f"to_timestamp((floor(extract(epoch FROM {now}) / interval_s) + 1) * interval_s)"

    def record_outcomes(self, rows: Sequence[tuple[str, int, int, int]]) -> None:
        sql = (
            f"INSERT INTO {O} AS o (queue, minute, acked, retried, dead) "
            "SELECT u.q, date_trunc('minute', statement_timestamp()), u.a, u.r, u.d "
            "FROM unnest(%s::text[], %s::bigint[], %s::bigint[], %s::bigint[]) AS u(q, a, r, d) "
            "ON CONFLICT (queue, minute) DO UPDATE SET acked = o.acked + excluded.acked, "
            "retried = o.retried + excluded.retried, dead = o.dead + excluded.dead"
        )
        columns = [list(column) for column in zip(*rows, strict=True)]
        with self.connection.cursor() as cursor:
            cursor.execute(sql, columns)


class SqliteMaintenanceSQL(MaintenanceSQL):
    def ids_sql(self) -> str:
        return "id IN (SELECT value FROM json_each(%s))"

    def ids_param(self, ids: Sequence[int]) -> Any:
        return json.dumps([int(i) for i in ids])

    def move_dead_to_live(self, cursor: Any, ids: Sequence[int]) -> dict[str, int]:
        # Inside the caller's write transaction: copy, then delete the same rows.
        match = self.ids_sql()
        param = self.ids_param(ids)
        cursor.execute(f"SELECT queue, count(*) FROM {D} WHERE {match} GROUP BY queue", [param])
        moved = {queue: int(n) for queue, n in cursor.fetchall()}
        if moved:
            cursor.execute(f"SELECT {self.dialect.now_sql()[0]}", [])
            now = cursor.fetchone()[0]
            select = REQUEUE_SELECT.format(now="%s")
            cursor.execute(
                f"INSERT INTO {J} ({REQUEUE_COLUMNS}) SELECT {select} FROM {D} WHERE {match}",
                [now, now, param],
            )
            cursor.execute(f"DELETE FROM {D} WHERE {match}", [param])
        return moved

    def next_boundary_sql(self, now: str) -> str:
        return (
            "strftime('%%Y-%%m-%%d %%H:%%M:%%S', "
            "((CAST(strftime('%%s', 'now') AS INTEGER) / interval_s) + 1) * interval_s, "
            "'unixepoch')"
        )

    def record_outcomes(self, rows: Sequence[tuple[str, int, int, int]]) -> None:
        # "WHERE true" keeps SQLite's parser from reading ON CONFLICT as a join clause.
        sql = (
            f"INSERT INTO {O} (queue, minute, acked, retried, dead) "
            "SELECT json_extract(value, '$[0]'), strftime('%%Y-%%m-%%d %%H:%%M:00', 'now'), "
            "json_extract(value, '$[1]'), json_extract(value, '$[2]'), "
            "json_extract(value, '$[3]') FROM json_each(%s) WHERE true "
            "ON CONFLICT (queue, minute) DO UPDATE SET acked = acked + excluded.acked, "
            "retried = retried + excluded.retried, dead = dead + excluded.dead"
        )
        with self.connection.cursor() as cursor:
            cursor.execute(sql, [json.dumps([list(row) for row in rows])])


def maintenance_for(using: str) -> MaintenanceSQL:
    """Return the operator statements for the database alias ``using``."""
    dialect = dialect_for(using)
    if dialect.vendor == "postgresql":
        return PostgresMaintenanceSQL(dialect)
    return SqliteMaintenanceSQL(dialect)
