"""PostgreSQL: ``FOR UPDATE SKIP LOCKED`` claims, single-statement moves, ``NOTIFY`` wake-ups."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import cache, cached_property
from typing import Any

from django.db import transaction

from ..records import EnqueueStamps
from ..records import Job as JobRecord
from .base import DEAD_COLUMNS, DEAD_COPY, JOB_SELECT, D, Dialect, J

NOW = "statement_timestamp()"
NEVER_AUTO_PREPARE = 2**62


def _plus(base: str, seconds: str) -> str:
    return f"({base} + make_interval(secs => {seconds}))"


@cache
def _enqueue_sql(single: bool, when: str, expires: bool) -> str:
    """The enqueue statement for one shape of batch (a handful exist; each is prepared once).

    One statement writes the rows and queues the wake-up, so they commit
    together; a notification sent inside the caller's transaction is
    delivered only on commit, and PostgreSQL folds repeats into one. One row
    returns its id and notifies in ``RETURNING``; many rows go through a CTE so
    the ids come back in payload order and ``pg_notify`` runs once.
    """
    run_at = {"now": NOW, "delay": _plus(NOW, "%s::float8"), "at": "%s::timestamptz"}[when]
    expires_at = _plus(NOW, "%s::float8") if expires else "NULL"
    columns = (
        f"INSERT INTO {J} (queue, payload, priority, run_at, attempts, max_attempts, "
        "visibility_timeout_s, retry_base_s, expires_at, state, enqueued_at)"
    )
    values = f"%s, {run_at}, 0, %s, %s, %s, {expires_at}, 'pending', {NOW}"
    if single:
        return f"{columns} VALUES (%s, %s::jsonb, {values}) RETURNING id, pg_notify(%s, '')"
    return (
        f"WITH ins AS ({columns} SELECT %s, u.p::jsonb, {values} "
        "FROM unnest(%s::text[]) WITH ORDINALITY AS u(p, o) ORDER BY u.o RETURNING id) "
        "SELECT ins.id FROM ins, (SELECT pg_notify(%s, '')) AS n ORDER BY ins.id"
    )


class PostgresDialect(Dialect):
    vendor = "postgresql"

    def __init__(self, using: str) -> None:
        super().__init__(using)
        self._cursors = threading.local()

    @contextmanager
    def write_transaction(self) -> Iterator[Any]:
        with transaction.atomic(using=self.using), self.connection.cursor() as cursor:
            yield cursor

    def now_sql(self) -> tuple[str, list[Any]]:
        return NOW, []

    def plus_sql(self, base: str, seconds: str) -> str:
        return _plus(base, seconds)

    def fetch_prepared(
        self, sql: str, params: Sequence[Any], *, keep_cursor: bool = False
    ) -> list[tuple[Any, ...]]:
        """Run ``sql`` as a server-side prepared statement and return its rows.

        For the worker's own statements and ``enqueue()``, run many times a
        second: Django's cursor binds parameters client-side, so the server
        would parse and plan every call. The connection (and its transaction
        state, its adapters) is still Django's; errors are Django's. A site
        behind a transaction-mode pooler sets ``DISABLE_SERVER_SIDE_CURSORS``
        (as Django advises); then the statement is bound server-side but not
        prepared, since a named statement would not follow the next
        transaction.

        ``keep_cursor`` reuses one cursor per thread and connection: a fresh
        cursor costs more than the Python of a whole ``enqueue()`` (its result
        loaders are looked up again). A kept cursor holds its last result until
        the next call, so it is only for statements that return a few small
        rows; a claim's rows carry payloads and get a cursor of their own.
        """
        # Imported here, not at the top: nothing may import psycopg on a SQLite site,
        # where it need not be installed (it is the optional extra "postgres").
        import psycopg

        wrapper = self.connection
        wrapper.ensure_connection()
        raw = wrapper.connection
        prepare = not wrapper.settings_dict.get("DISABLE_SERVER_SIDE_CURSORS")
        if prepare and raw.prepare_threshold is None:
            # Django turns psycopg's preparation off (threshold None), which
            # also ignores prepare=True. A threshold no query count reaches
            # keeps automatic preparation off for the site's own queries while
            # honouring ours.
            raw.prepare_threshold = NEVER_AUTO_PREPARE
        if keep_cursor:
            cursor = getattr(self._cursors, "cursor", None)
            if cursor is None or cursor.connection is not raw:
                # Django's reconnect makes a new connection object.
                cursor = self._cursors.cursor = psycopg.Cursor(raw)
        else:
            cursor = psycopg.Cursor(raw)
        with wrapper.wrap_database_errors:
            try:
                cursor.execute(sql, params, prepare=prepare)
                return cursor.fetchall()
            finally:
                if not keep_cursor:
                    cursor.close()

    def enqueue(self, stamps: EnqueueStamps, payloads: Sequence[str]) -> list[int]:
        params: list[Any] = [stamps.priority]
        if stamps.delay_s is not None:
            when = "delay"
            params.append(stamps.delay_s)
        elif stamps.run_at is not None:
            when = "at"
            params.append(self.adapt_datetime(stamps.run_at))
        else:
            when = "now"
        params += stamps.stamp_params()
        if stamps.expires_s is not None:
            params.append(stamps.expires_s)
        single = len(payloads) == 1
        if single:
            params = [stamps.queue, payloads[0], *params, stamps.channel]
        else:
            params = [stamps.queue, *params, list(payloads), stamps.channel]
        sql = _enqueue_sql(single, when, stamps.expires_s is not None)
        return [row[0] for row in self.fetch_prepared(sql, params, keep_cursor=True)]

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
        # One statement, so one round trip and one commit: the fenced acks, the
        # lapsed-claim sweep and the claim. Every CTE sees one snapshot, so a
        # lapsed row cannot wait for a later statement to become claimable:
        # the candidates are the pending rows and the lapsed rows with
        # attempts left, both locked SKIP LOCKED, and the best n of them are
        # claimed; lapsed rows left over go back to pending (their handles
        # are already invalid), exhausted ones to the dead letters. The CTEs
        # touch disjoint rows: an acked row's claim is live, a lapsed one's
        # has passed.
        ids = [f[0] for f in fences]
        params = [ids, [f[1] for f in fences], ids, ack_worker_id, queue, queue, n, n, worker_id]
        rows = self.fetch_prepared(self._claim_sql, params)
        acked = list(rows[0][0] or ()) if rows else []
        jobs = [self.job_from_row(row[1:]) for row in rows if row[1] is not None]
        jobs.sort(key=lambda job: (-job.priority, job.run_at, job.id))
        return acked, jobs

    @cached_property
    def _claim_sql(self) -> str:
        due = f"(j.expires_at IS NULL OR j.expires_at > {NOW})"
        returning = ", ".join("j." + c for c in JOB_SELECT.split(", "))
        claimed = ", ".join("c." + c for c in JOB_SELECT.split(", "))
        return (
            # id = ANY() steers the planner to the primary key whatever the
            # estimate for unnest().
            f"WITH acked AS (DELETE FROM {J} j USING unnest(%s::bigint[], %s::bigint[]) "
            "AS f(id, generation) WHERE j.id = ANY(%s::bigint[]) AND j.id = f.id "
            "AND j.generation = f.generation "
            f"AND j.worker_id = %s AND j.state = 'processing' AND j.claim_expires_at > {NOW} "
            "RETURNING j.id), "
            f"lapsed AS (SELECT j.id, j.priority, j.run_at, j.attempts < j.max_attempts AS live, "
            f"{due} AS due FROM {J} j WHERE j.queue = %s AND j.state = 'processing' "
            f"AND j.claim_expires_at <= {NOW} FOR UPDATE SKIP LOCKED), "
            f"fresh AS (SELECT j.id, j.priority, j.run_at FROM {J} j WHERE j.queue = %s "
            f"AND j.state = 'pending' AND j.run_at <= {NOW} AND {due} "
            "ORDER BY j.priority DESC, j.run_at, j.id LIMIT %s FOR UPDATE SKIP LOCKED), "
            "pick AS (SELECT id FROM (SELECT id, priority, run_at FROM fresh UNION ALL "
            "SELECT id, priority, run_at FROM lapsed WHERE live AND due) AS u "
            "ORDER BY priority DESC, run_at, id LIMIT %s), "
            # The moves of lapsed rows look them up by primary key the same way
            # as the claim below, whatever the generic plan guesses for lapsed.
            f"dead AS (DELETE FROM {J} j "
            "WHERE j.id = ANY(ARRAY(SELECT id FROM lapsed WHERE NOT live)) RETURNING j.*), "
            f"buried AS (INSERT INTO {D} ({DEAD_COLUMNS}) SELECT {DEAD_COPY}, "
            f"'max attempts exceeded', {NOW} FROM dead), "
            f"revived AS (UPDATE {J} j SET state = 'pending', worker_id = NULL, "
            "claim_expires_at = NULL WHERE j.id = ANY(ARRAY(SELECT id FROM lapsed "
            "WHERE live AND id NOT IN (SELECT id FROM pick)))), "
            f"c AS (UPDATE {J} j SET state = 'processing', attempts = j.attempts + 1, "
            "generation = j.generation + 1, "
            f"worker_id = %s, claim_expires_at = {self.plus_sql(NOW, 'j.visibility_timeout_s')} "
            # = ANY(ARRAY(...)) keeps the primary-key lookup in the generic plan a
            # prepared statement settles on; a join on pick there estimates
            # 1000 rows and hash-joins a sequential scan of the whole table.
            f"WHERE j.id = ANY(ARRAY(SELECT id FROM pick)) RETURNING {returning}) "
            f"SELECT (SELECT array_agg(id) FROM acked), {claimed} "
            "FROM (SELECT 1) AS one LEFT JOIN c ON true"
        )

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
            f"DELETE FROM {J} j USING unnest(%s::bigint[], %s::bigint[]) AS f(id, generation) "
            "WHERE j.id = f.id AND j.generation = f.generation AND j.worker_id = %s "
            f"AND j.state = 'processing' AND j.claim_expires_at > {NOW} RETURNING j.id"
        )
        with self.connection.cursor() as cursor:
            cursor.execute(sql, [[f[0] for f in fences], [f[1] for f in fences], worker_id])
            return [row[0] for row in cursor.fetchall()]

    def notify(self, channel: str, payload: str) -> None:
        with self.connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [channel, payload])
