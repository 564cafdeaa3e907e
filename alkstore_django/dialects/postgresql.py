"""PostgreSQL: ``FOR UPDATE SKIP LOCKED`` claims, single-statement moves, ``NOTIFY`` wake-ups."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from django.db import transaction

from ..records import Job as JobRecord
from .base import DEAD_COLUMNS, DEAD_COPY, JOB_SELECT, D, Dialect, J

NOW = "statement_timestamp()"


class PostgresDialect(Dialect):
    vendor = "postgresql"

    @contextmanager
    def write_transaction(self) -> Iterator[Any]:
        with transaction.atomic(using=self.using), self.connection.cursor() as cursor:
            yield cursor

    def now_sql(self) -> tuple[str, list[Any]]:
        return NOW, []

    def plus_sql(self, base: str, seconds: str) -> str:
        return f"({base} + make_interval(secs => {seconds}))"

    def enqueue(
        self,
        queue: str,
        payloads: Sequence[str],
        stamps: dict[str, Any],
        run_at: datetime | None,
        delay_s: float | None,
        expires_s: float | None,
        channel: str,
    ) -> list[int]:
        # One statement: the rows and the wake-up commit together, and a
        # notification sent inside the caller's transaction is delivered only
        # on commit (PostgreSQL folds the repeats into one).
        run_at_sql, run_at_params = self._run_at(run_at, delay_s)
        expires_sql = self.plus_sql(NOW, "%s::float8") if expires_s is not None else "NULL"
        sql = (
            f"WITH ins AS (INSERT INTO {J} (queue, payload, priority, run_at, attempts, "
            "max_attempts, visibility_timeout_s, retry_base_s, expires_at, state, enqueued_at) "
            f"SELECT %s, u.p::jsonb, %s, {run_at_sql}, 0, %s, %s, %s, {expires_sql}, "
            f"'pending', {NOW} FROM unnest(%s::text[]) WITH ORDINALITY AS u(p, o) "
            "ORDER BY u.o RETURNING id) "
            "SELECT ins.id FROM ins, (SELECT pg_notify(%s, '')) AS n ORDER BY ins.id"
        )
        params: list[Any] = [queue, stamps["priority"], *run_at_params]
        params += [stamps["max_attempts"], stamps["visibility_timeout_s"], stamps["retry_base_s"]]
        if expires_s is not None:
            params.append(expires_s)
        params += [list(payloads), channel]
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            return [row[0] for row in cursor.fetchall()]

    def _run_at(self, run_at: datetime | None, delay_s: float | None) -> tuple[str, list[Any]]:
        if delay_s is not None:
            return self.plus_sql(NOW, "%s::float8"), [delay_s]
        if run_at is not None:
            return "%s::timestamptz", [self.adapt_datetime(run_at)]
        return NOW, []

    def claim(self, queue: str, worker_id: str, n: int) -> list[JobRecord]:
        # Lapsed claims first: exhausted ones are buried, the rest become
        # claimable again in their original order (their handles are already
        # invalid: the deadline has passed).
        lapse_sql = (
            f"WITH lapsed AS (SELECT id FROM {J} WHERE queue = %s AND state = 'processing' "
            f"AND claim_expires_at <= {NOW} FOR UPDATE SKIP LOCKED), "
            f"dead AS (DELETE FROM {J} j USING lapsed l WHERE j.id = l.id "
            f"AND j.attempts >= j.max_attempts RETURNING j.*), "
            f"buried AS (INSERT INTO {D} ({DEAD_COLUMNS}) SELECT {DEAD_COPY}, "
            f"'max attempts exceeded', {NOW} FROM dead) "
            f"UPDATE {J} j SET state = 'pending', worker_id = NULL, claim_expires_at = NULL "
            "FROM lapsed l WHERE j.id = l.id AND j.attempts < j.max_attempts"
        )
        claim_sql = (
            f"UPDATE {J} j SET state = 'processing', attempts = j.attempts + 1, worker_id = %s, "
            f"claim_expires_at = {self.plus_sql(NOW, 'j.visibility_timeout_s')} "
            f"FROM (SELECT id FROM {J} WHERE queue = %s AND state = 'pending' "
            f"AND run_at <= {NOW} AND (expires_at IS NULL OR expires_at > {NOW}) "
            "ORDER BY priority DESC, run_at, id LIMIT %s FOR UPDATE SKIP LOCKED) c "
            f"WHERE j.id = c.id RETURNING {', '.join('j.' + c for c in JOB_SELECT.split(', '))}"
        )
        with self.connection.cursor() as cursor:
            cursor.execute(lapse_sql, [queue])
            cursor.execute(claim_sql, [worker_id, queue, n])
            rows = cursor.fetchall()
        jobs = [self.job_from_row(row) for row in rows]
        jobs.sort(key=lambda job: (-job.priority, job.run_at, job.id))
        return jobs

    def bury(self, where: str, params: list[Any], error: str) -> int:
        sql = (
            f"WITH dead AS (DELETE FROM {J} WHERE {where.format(now=NOW)} RETURNING *) "
            f"INSERT INTO {D} ({DEAD_COLUMNS}) SELECT {DEAD_COPY}, %s, {NOW} FROM dead"
        )
        with self.connection.cursor() as cursor:
            cursor.execute(sql, [*params, error])
            return cursor.rowcount

    def ack_many(self, queue: str, ids: Sequence[int]) -> int:
        sql = (
            f"DELETE FROM {J} WHERE id = ANY(%s::bigint[]) AND queue = %s "
            f"AND state = 'processing' AND claim_expires_at > {NOW}"
        )
        with self.connection.cursor() as cursor:
            cursor.execute(sql, [list(ids), queue])
            return cursor.rowcount

    def ack_fenced(self, worker_id: str, fences: Sequence[tuple[int, int]]) -> list[int]:
        sql = (
            f"DELETE FROM {J} j USING unnest(%s::bigint[], %s::int[]) AS f(id, attempts) "
            "WHERE j.id = f.id AND j.attempts = f.attempts AND j.worker_id = %s "
            f"AND j.state = 'processing' AND j.claim_expires_at > {NOW} RETURNING j.id"
        )
        with self.connection.cursor() as cursor:
            cursor.execute(sql, [[f[0] for f in fences], [f[1] for f in fences], worker_id])
            return [row[0] for row in cursor.fetchall()]

    def notify(self, channel: str, payload: str) -> None:
        with self.connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [channel, payload])
