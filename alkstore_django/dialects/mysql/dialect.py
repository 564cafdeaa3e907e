"""MariaDB 10.6+ and MySQL 8.0+ (Django's ``mysql`` vendor) through mysqlclient.

Claims are ``SELECT … FOR UPDATE SKIP LOCKED`` followed by an ``UPDATE`` by
primary key and a read-back, inside one transaction: there is no
``UPDATE … RETURNING``. The clock is ``UTC_TIMESTAMP(6)`` (microseconds, and
UTC whatever the session's time zone, as Django stores naive UTC). A claim,
an ack and a sweep that hit a deadlock or a lock-wait timeout (1213/1205) are
retried in a fresh transaction, never surfaced.

There are no partial indexes: ``prepare_schema`` (run by migration 0007)
rebuilds ``alk_job_claim`` led by ``(queue, state)`` so the claim stays an
ordered index scan, and gives the app's tables a binary, no-pad collation so
names compare exactly as on the other engines (case, accents and trailing
spaces all count).

There is no NOTIFY either: ``MysqlWatcher`` polls, adaptively, a probe of
the watched queues' claimable rows and the message table that
``store.notify`` writes to.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import Any, TypeVar

from django.core import checks
from django.db import IntegrityError, transaction

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
    REQUEUE_COLUMNS,
    REQUEUE_SELECT,
    STAMP_MARKS,
    Dialect,
    Watcher,
    marks,
)
from ..cancels import CancelStatements
from ..claims import ClaimStatements
from ..controls import CONTROL_TABLE, PAUSED, ControlStatements
from ..leases import LeaseStatements
from ..operators import OperatorStatements
from ..schedules import ScheduleStatements
from ..unique import UniqueJobs
from . import schema as mysql_schema
from .schema import CLAIM_INDEX, UNIQUE_INDEX
from .sql import DUPLICATE_KEY, NOW, error_code, plus
from .transactions import retry_lock_races, run_in_transaction
from .upserts import DuplicateKeyUpserts
from .watch import MysqlWatcher

T = TypeVar("T")

LAPSED_BATCH = 1_000


class MysqlDialect(
    ClaimStatements,
    CancelStatements,
    UniqueJobs,
    ControlStatements,
    OperatorStatements,
    LeaseStatements,
    ScheduleStatements,
    DuplicateKeyUpserts,
    Dialect,
):
    """MariaDB 10.6+ / MySQL 8.0+, ``READ COMMITTED`` (Django's default isolation level)."""

    vendor = "mysql"
    supports_skip_locked = True
    # Not INSERT IGNORE: its shared lock on an existing row, upgraded by the
    # claim's SELECT … FOR UPDATE in two sessions at once, would deadlock.
    ensure_control_sql = (
        f"INSERT INTO {CONTROL_TABLE} (queue) VALUES (%s) ON DUPLICATE KEY UPDATE queue = queue"
    )
    # A locking read sees the latest committed row even inside a caller's
    # REPEATABLE READ snapshot that predates the holder; the duplicate-key
    # error already left a shared lock on its index entry, so it costs nothing.
    holder_read_lock = " LOCK IN SHARE MODE"
    # The same for the windows: under REPEATABLE READ a plain read of them is
    # the snapshot's, which may predate a window committed since, and the
    # enqueue would write a duplicate. Only unique enqueues read windows.
    window_read_lock = " LOCK IN SHARE MODE"

    @classmethod
    def check_settings(cls, alias: str, config: dict[str, Any]) -> list[checks.CheckMessage]:
        return mysql_schema.settings_warnings(alias, config)

    @classmethod
    def prepare_schema(cls, schema_editor: Any, tables: Sequence[str]) -> None:
        mysql_schema.prepare_schema(schema_editor, tables)

    @classmethod
    def unprepare_schema(cls, schema_editor: Any) -> None:
        mysql_schema.drop_unique_index(schema_editor)

    def server_problem(self) -> str | None:
        return mysql_schema.server_problem(self.connection)

    @cached_property
    def _returning(self) -> bool:
        """MariaDB has ``INSERT … RETURNING`` (10.5+) and ``DELETE … RETURNING``; MySQL has none."""
        return bool(self.connection.mysql_is_mariadb)

    # --- hooks ----------------------------------------------------------------------

    def now_sql(self) -> tuple[str, list[Any]]:
        return NOW, []

    def plus_sql(self, base: str, seconds: str) -> str:
        return plus(base, seconds)

    def ids_sql(self, ids: Sequence[int]) -> tuple[str, list[Any]]:
        # A list of constants is a primary-key range lookup; IN (NULL) matches nothing.
        if not ids:
            return "id IN (NULL)", []
        return f"id IN ({marks(len(ids))})", [int(i) for i in ids]

    def to_datetime(self, value: Any) -> datetime | None:
        if value is None or value.tzinfo is not None:
            return value
        return value.replace(tzinfo=UTC)  # type: ignore[no-any-return]

    def open_watcher(
        self,
        channels: Sequence[str],
        *,
        queues: Sequence[str] = (),
        listen_alias: str | None = None,
    ) -> Watcher:
        return MysqlWatcher(listen_alias or self.using, list(channels), list(queues))

    @staticmethod
    def _read_now(cursor: Any) -> datetime:
        cursor.execute(f"SELECT {NOW}", [])
        return cursor.fetchone()[0]  # type: ignore[no-any-return]

    # --- queue moves -------------------------------------------------------------------

    @staticmethod
    def _row_sql(stamps: EnqueueStamps) -> tuple[str, list[Any]]:
        """Return one enqueued row's VALUES tuple after queue and payload, and its params."""
        shared: list[Any] = [stamps.priority]
        if stamps.delay_s is not None:
            run_at = plus(NOW, "%s")
            shared.append(stamps.delay_s)
        elif stamps.run_at is not None:
            run_at = "%s"
            shared.append(stamps.run_at)
        else:
            run_at = NOW
        shared += stamps.stamp_params()
        expires_at = "NULL"
        if stamps.expires_s is not None:
            expires_at = plus(NOW, "%s")
            shared.append(stamps.expires_s)
        return f"%s, {run_at}, 0, {STAMP_MARKS}, {expires_at}, 'pending', {NOW}", shared

    def enqueue(self, stamps: EnqueueStamps, payloads: Sequence[str]) -> list[int]:
        # Workers notice the commit through their watcher's probe of the job table.
        values, shared = self._row_sql(stamps)
        if stamps.run_at is not None and stamps.delay_s is None:
            shared[1] = self.adapt_datetime(stamps.run_at)
        row = f"(%s, %s, {values})"
        params: list[Any] = []
        for payload in payloads:
            params += [stamps.queue, payload, *shared]
        sql = f"INSERT INTO {JOB_TABLE} ({ENQUEUE_COLUMNS}) VALUES " + ", ".join(
            [row] * len(payloads)
        )
        with self.connection.cursor() as cursor:
            if self._returning:
                cursor.execute(sql + " RETURNING id", params)
                return sorted(row[0] for row in cursor.fetchall())
            # One multi-row INSERT takes consecutive auto-increment values
            # ("simple inserts", any innodb_autoinc_lock_mode); lastrowid is the first.
            cursor.execute(sql, params)
            first = int(cursor.lastrowid)
            return list(range(first, first + len(payloads)))

    def run_again_on_lock_race(self, attempt: Callable[[], T]) -> T:
        # InnoDB's duplicate-key deadlock: two inserts waiting on a key's
        # holder both take a shared lock on it, and once it rolls back or
        # leaves each needs the exclusive one. The loser is rolled back whole;
        # run again in its own transaction, it finds the winner's row.
        return retry_lock_races(self.connection, attempt)

    def insert_unique(
        self, cursor: Any, stamps: EnqueueStamps, keyed: dict[str, str]
    ) -> dict[str, int]:
        # No ON CONFLICT DO NOTHING (INSERT IGNORE would hide every other error
        # too): one row per savepoint, a duplicate key rolled back to it. The
        # insert waits for a concurrent, uncommitted insert of the same key.
        values, shared = self._row_sql(stamps)
        if stamps.run_at is not None and stamps.delay_s is None:
            shared[1] = self.adapt_datetime(stamps.run_at)
        sql = (
            f"INSERT INTO {JOB_TABLE} ({ENQUEUE_COLUMNS}, unique_key) VALUES (%s, %s, {values}, %s)"
        )
        written: dict[str, int] = {}
        for key, payload in keyed.items():
            try:
                with transaction.atomic(using=self.using):
                    cursor.execute(sql, [stamps.queue, payload, *shared, key])
            except IntegrityError as exc:
                if error_code(exc) != DUPLICATE_KEY or UNIQUE_INDEX not in str(exc):
                    raise
                continue
            written[key] = int(cursor.lastrowid)
        return written

    def claim_and_ack(
        self,
        queue: str,
        worker_id: str,
        n: int,
        ack_worker_id: str,
        fences: Sequence[tuple[int, int]],
    ) -> tuple[list[int], list[JobRecord]]:
        # The lapsed claims are dealt with before the claim, in the same
        # transaction: the revived rows are ours (locked by us), so the claim's
        # SKIP LOCKED does not skip them and they compete on priority as new ones.
        def body(cursor: Any) -> tuple[list[int], list[JobRecord]]:
            acked = self._delete_fenced(cursor, ack_worker_id, fences) if fences else []
            now, lapsed, paused = self._now_and_lapsed(cursor, queue)
            dead = [row[0] for row in lapsed if not row[1]]
            self._move_to_dead(cursor, dead, "max attempts exceeded", now)
            revive = [row[0] for row in lapsed if row[1]]
            if revive:
                match, params = self.ids_sql(revive)
                cursor.execute(
                    f"UPDATE {JOB_TABLE} SET state = 'pending', worker_id = NULL, "
                    f"claim_expires_at = NULL WHERE {match}",
                    params,
                )
            if paused:
                return acked, []
            # Forced: a scan of any other index (a small table invites one)
            # would lock, test and let go of other queues' rows, and a
            # concurrent claim there would skip them as if they were taken.
            cursor.execute(
                f"SELECT {JOB_SELECT} FROM {JOB_TABLE} FORCE INDEX ({CLAIM_INDEX}) "
                "WHERE queue = %s AND state = 'pending' "
                "AND run_at <= %s AND (expires_at IS NULL OR expires_at > %s) "
                "ORDER BY priority DESC, run_at, id LIMIT %s FOR UPDATE SKIP LOCKED",
                [queue, now, now, n],
            )
            return acked, self._mark_claimed(cursor, cursor.fetchall(), worker_id, now)

        acked, jobs = run_in_transaction(self.connection, body)
        jobs.sort(key=lambda job: (-job.priority, job.run_at, job.id))
        return acked, jobs

    def _mark_claimed(
        self, cursor: Any, rows: Sequence[Sequence[Any]], worker_id: str, now: datetime
    ) -> list[JobRecord]:
        """Claim the locked pending ``rows`` (full job rows) and return them as claimed.

        There is no ``UPDATE … RETURNING``, so rather than read the rows back
        the claim writes values it knows: each deadline is computed here, from
        the database clock ``now``, and written as is (one ``UPDATE`` per
        distinct visibility timeout, usually one).
        """
        by_deadline: dict[datetime, list[int]] = {}
        claimed = []
        codec = app_settings.payload_codec
        for row in rows:
            deadline = now + timedelta(microseconds=round(row[7] * 1_000_000))
            by_deadline.setdefault(deadline, []).append(row[0])
            values = list(row)
            values[5] += 1  # attempts
            values[10], values[11], values[12] = "processing", worker_id, deadline
            values[15] += 1  # generation
            claimed.append(self.job_from_row(values, codec))
        for deadline, ids in by_deadline.items():
            match, params = self.ids_sql(ids)
            cursor.execute(
                f"UPDATE {JOB_TABLE} SET state = 'processing', attempts = attempts + 1, "
                "generation = generation + 1, worker_id = %s, claim_expires_at = %s "
                f"WHERE {match}",
                [worker_id, deadline, *params],
            )
        return claimed

    def _now_and_lapsed(self, cursor: Any, queue: str) -> tuple[datetime, list[Any], bool]:
        """Read the clock, whether the queue is paused, and lock its lapsed claims.

        Returns (now, [(id, has attempts left)], paused). One round trip finds
        all three (they ride the clock's row); the candidates are then locked
        by primary key, skipping those another claimant holds. At most
        ``LAPSED_BATCH`` per claim: the rest wait for the next one.
        """
        cursor.execute(
            f"SELECT {NOW}, (SELECT JSON_ARRAYAGG(id) FROM (SELECT id FROM {JOB_TABLE} "
            "WHERE queue = %s AND state = 'processing' AND claim_expires_at <= "
            f"{NOW} LIMIT {LAPSED_BATCH}) AS lapsed), {PAUSED}",
            [queue, queue],
        )
        now, candidates, paused = cursor.fetchone()
        if not candidates:
            return now, [], bool(paused)
        ids = json.loads(candidates)
        cursor.execute(
            f"SELECT id, attempts < max_attempts FROM {JOB_TABLE} WHERE id IN "
            f"({marks(len(ids))}) AND state = 'processing' AND claim_expires_at <= %s "
            "FOR UPDATE SKIP LOCKED",
            [*ids, now],
        )
        return now, list(cursor.fetchall()), bool(paused)

    @staticmethod
    def _lock_matching(
        cursor: Any,
        where: str,
        params: Sequence[Any],
        *,
        columns: str = "id",
        skip_locked: bool = False,
    ) -> list[Any]:
        """Lock the live rows matching ``where`` and return ``columns`` of each.

        A plain read finds the candidates, then they are locked by primary key
        with ``where`` tested again. A locking scan would lock every row it
        reads and let go of those that do not match, and for that moment a
        concurrent ``SKIP LOCKED`` claim would skip them.
        """
        cursor.execute(f"SELECT id FROM {JOB_TABLE} WHERE {where}", list(params))
        candidates = [row[0] for row in cursor.fetchall()]
        if not candidates:
            return []
        lock = "FOR UPDATE SKIP LOCKED" if skip_locked else "FOR UPDATE"
        cursor.execute(
            f"SELECT {columns} FROM {JOB_TABLE} WHERE id IN ({marks(len(candidates))}) "
            f"AND {where} {lock}",
            [*candidates, *params],
        )
        return list(cursor.fetchall())

    def _delete_fenced(
        self, cursor: Any, worker_id: str, fences: Sequence[tuple[int, int]]
    ) -> list[int]:
        """Delete the rows still under these claims; return their ids."""
        match, params = self.ids_sql([job_id for job_id, _ in fences])
        pairs = ", ".join(["(%s, %s)"] * len(fences))
        where = (
            f"{match} AND (id, generation) IN ({pairs}) AND worker_id = %s "
            f"AND state = 'processing' AND claim_expires_at > {NOW}"
        )
        params += [*(value for fence in fences for value in fence), worker_id]
        if self._returning:
            cursor.execute(f"DELETE FROM {JOB_TABLE} WHERE {where} RETURNING id", params)
            return [row[0] for row in cursor.fetchall()]
        # MySQL has no DELETE … RETURNING: lock the rows to learn their ids first.
        cursor.execute(f"SELECT id FROM {JOB_TABLE} WHERE {where} FOR UPDATE", params)
        ids = [row[0] for row in cursor.fetchall()]
        if ids:
            match, params = self.ids_sql(ids)
            cursor.execute(f"DELETE FROM {JOB_TABLE} WHERE {match}", params)
        return ids

    def _move_to_dead(self, cursor: Any, ids: Sequence[int], error: str, now: datetime) -> int:
        """Copy the locked live rows ``ids`` to the dead letters and delete them."""
        if not ids:
            return 0
        match, params = self.ids_sql(ids)
        cursor.execute(
            f"INSERT INTO {DEAD_TABLE} ({DEAD_COLUMNS}) SELECT {DEAD_COPY}, %s, %s "
            f"FROM {JOB_TABLE} WHERE {match}",
            [error, now, *params],
        )
        cursor.execute(f"DELETE FROM {JOB_TABLE} WHERE {match}", params)
        return len(ids)

    def bury(self, where: str, params: list[Any], error: str) -> int:
        def body(cursor: Any) -> int:
            now = self._read_now(cursor)
            rows = self._lock_matching(cursor, where.format(now="%s"), [*params, now])
            return self._move_to_dead(cursor, [row[0] for row in rows], error, now)

        return run_in_transaction(self.connection, body)

    def ack_many(self, queue: str, ids: Sequence[int]) -> int:
        match, params = self.ids_sql(ids)
        sql = (
            f"DELETE FROM {JOB_TABLE} WHERE {match} AND queue = %s "
            f"AND state = 'processing' AND claim_expires_at > {NOW}"
        )
        return self._rowcount(sql, [*params, queue])

    def ack_fenced(self, worker_id: str, fences: Sequence[tuple[int, int]]) -> list[int]:
        if not fences:
            return []
        return run_in_transaction(
            self.connection, lambda cursor: self._delete_fenced(cursor, worker_id, fences)
        )

    def notify(self, channel: str, payload: str) -> None:
        # A message row, read by the listeners' watchers (which also trim old ones).
        self._rowcount(
            f"INSERT INTO {MESSAGE_TABLE} (channel, payload, created_at) VALUES (%s, %s, {NOW})",
            [channel, payload],
        )

    # --- operators --------------------------------------------------------------------

    def move_dead_to_live(self, cursor: Any, ids: Sequence[int]) -> dict[str, int]:
        match, params = self.ids_sql(ids)
        cursor.execute(
            f"SELECT queue, count(*) FROM (SELECT queue FROM {DEAD_TABLE} WHERE {match} "
            "FOR UPDATE) AS d GROUP BY queue",
            params,
        )
        moved = {queue: int(n) for queue, n in cursor.fetchall()}
        if moved:
            now = self._read_now(cursor)
            cursor.execute(
                f"INSERT INTO {JOB_TABLE} ({REQUEUE_COLUMNS}) "
                f"SELECT {REQUEUE_SELECT.format(now='%s')} FROM {DEAD_TABLE} WHERE {match}",
                [now, now, *params],
            )
            cursor.execute(f"DELETE FROM {DEAD_TABLE} WHERE {match}", params)
        return moved

    def delete_batch(
        self, table: str, key: str, where: str, params: Sequence[Any], order_by: str, limit: int
    ) -> int:
        # MySQL cannot DELETE with a LIMITed subquery on the same table; a
        # single-table DELETE takes ORDER BY and LIMIT itself (and walks the
        # same index).
        sql = f"DELETE FROM {table} WHERE {where} ORDER BY {order_by} LIMIT %s"
        return self._rowcount(sql, [*params, limit])
