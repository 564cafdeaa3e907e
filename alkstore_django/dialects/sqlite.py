"""SQLite: claims and moves inside one ``BEGIN IMMEDIATE`` write transaction.

A deferred transaction that reads before it writes can fail with
``SQLITE_BUSY_SNAPSHOT`` no matter the busy timeout, so every multi-statement
change here takes the write lock up front. The clock is read once per
transaction and passed as a value, so every statement in it agrees on "now".
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from django.utils.dateparse import parse_datetime

from ..records import EnqueueStamps
from ..records import Job as JobRecord
from .base import DEAD_COLUMNS, DEAD_COPY, JOB_SELECT, D, Dialect, J

FORMAT = "'%%Y-%%m-%%d %%H:%%M:%%f'"
NOW = f"strftime({FORMAT}, 'now')"
MESSAGE_TAIL = 10_000


class SqliteDialect(Dialect):
    vendor = "sqlite"

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

    def now_sql(self) -> tuple[str, list[Any]]:
        return NOW, []

    def plus_sql(self, base: str, seconds: str) -> str:
        return f"strftime({FORMAT}, {base}, printf('%%+.3f seconds', {seconds}))"

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

    def enqueue(self, stamps: EnqueueStamps, payloads: Sequence[str]) -> list[int]:
        # One statement over a JSON array of the encoded payloads; SQLite has no
        # NOTIFY, so workers notice the commit by watching the file instead.
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
        params.append(json.dumps(list(payloads)))
        sql = (
            f"INSERT INTO {J} (queue, payload, priority, run_at, attempts, max_attempts, "
            "visibility_timeout_s, retry_base_s, expires_at, state, enqueued_at) "
            f"SELECT %s, value, %s, {run_at_sql}, 0, %s, %s, %s, {expires_sql}, 'pending', {NOW} "
            "FROM json_each(%s) ORDER BY key RETURNING id"
        )
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            return sorted(row[0] for row in cursor.fetchall())

    def claim(self, queue: str, worker_id: str, n: int) -> list[JobRecord]:
        return self.claim_and_ack(queue, worker_id, n, "", ())[1]

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
            f"UPDATE {J} SET state = 'processing', attempts = attempts + 1, "
            "generation = generation + 1, worker_id = %s, "
            f"claim_expires_at = {self.plus_sql('%s', 'visibility_timeout_s')} "
            f"WHERE id IN (SELECT id FROM {J} WHERE queue = %s AND state = 'pending' "
            "AND +run_at <= %s AND (expires_at IS NULL OR expires_at > %s) "
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
                f"UPDATE {J} SET state = 'pending', worker_id = NULL, claim_expires_at = NULL "
                f"WHERE {lapsed} AND attempts < max_attempts",
                [queue, now],
            )
            cursor.execute(claim_sql, [worker_id, now, queue, now, now, n])
            rows = cursor.fetchall()
        jobs = [self.job_from_row(row) for row in rows]
        jobs.sort(key=lambda job: (-job.priority, job.run_at, job.id))
        return acked, jobs

    @staticmethod
    def _bury(cursor: Any, where: str, params: list[Any], error: str, now: str) -> int:
        cursor.execute(
            f"INSERT INTO {D} ({DEAD_COLUMNS}) SELECT {DEAD_COPY}, %s, %s FROM {J} WHERE {where}",
            [error, now, *params],
        )
        moved = cursor.rowcount
        if moved:
            cursor.execute(f"DELETE FROM {J} WHERE {where}", params)
        return moved

    def bury(self, where: str, params: list[Any], error: str) -> int:
        with self.write_transaction() as cursor:
            now = self._read_now(cursor)
            return self._bury(cursor, where.format(now="%s"), [*params, now], error, now)

    def ack_many(self, queue: str, ids: Sequence[int]) -> int:
        sql = (
            f"DELETE FROM {J} WHERE id IN (SELECT value FROM json_each(%s)) AND queue = %s "
            f"AND state = 'processing' AND claim_expires_at > {NOW}"
        )
        with self.connection.cursor() as cursor:
            cursor.execute(sql, [json.dumps(list(ids)), queue])
            return cursor.rowcount

    @staticmethod
    def _ack_sql(now: str) -> str:
        return (
            f"DELETE FROM {J} WHERE (id, generation) IN (SELECT json_extract(value, '$[0]'), "
            "json_extract(value, '$[1]') FROM json_each(%s)) AND worker_id = %s "
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
        from ..models import ChannelMessage

        table = ChannelMessage._meta.db_table
        with self.connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {table} (channel, payload, created_at) VALUES (%s, %s, {NOW})",
                [channel, payload],
            )
            # Listeners read only what arrives while they watch: keep a short tail.
            cursor.execute(
                f"DELETE FROM {table} WHERE id <= %s - {MESSAGE_TAIL}", [cursor.lastrowid]
            )
