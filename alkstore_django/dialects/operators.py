"""The operators' and the retention's statements in standard SQL: every engine speaks them alike.

Dead letters, retry now, the queue overview, and the prunes that keep every
growing table bounded (docs/scale.md#retention-every-table-bounded): each
deletes at most one batch per statement (``Dialect.delete_batch``, which
MySQL writes its own way), run batch after batch by ``Dialect.in_batches``.
Requeueing a dead letter moves rows between tables, which each engine
writes its own way (``Dialect.move_dead_to_live``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from .base import (
    ATTEMPT_TABLE,
    DEAD_TABLE,
    JOB_TABLE,
    OUTCOME_TABLE,
    RESULT_TABLE,
    TASK_RESULT_TABLE,
    WINDOW_TABLE,
    WORKER_TABLE,
    Dialect,
)


def distinct_queues_sql(table: str) -> str:
    """Return SQL for the distinct queues of ``table``, sorted, read along its (queue, …) index.

    A loose index scan: one probe per queue, instead of reading every row as
    ``SELECT DISTINCT`` would.
    """
    return (
        f"WITH RECURSIVE q(queue) AS (SELECT min(queue) FROM {table} UNION ALL "
        f"SELECT (SELECT min(queue) FROM {table} WHERE queue > q.queue) FROM q "
        "WHERE q.queue IS NOT NULL) SELECT queue FROM q WHERE queue IS NOT NULL"
    )


class OperatorStatements(Dialect):
    """The operators' statements, written once."""

    def retry_now(
        self, cursor: Any, ids: Sequence[int] | None, queue: str | None
    ) -> tuple[int, list[str]]:
        """Make jobs waiting for a retry due now, inside the caller's write transaction.

        Waiting for a retry: pending, attempted at least once, due later (a
        backoff, or a retry's or snooze's delay). ``ids`` and ``queue``
        narrow the selection (None: any). Returns how many rows changed and
        the queues they are in, to wake.
        """
        now, now_params = self.now_sql()
        where, params = f"state = 'pending' AND attempts > 0 AND run_at > {now}", [*now_params]
        if ids is not None:
            match, match_params = self.ids_sql(ids)
            where, params = f"{where} AND {match}", [*params, *match_params]
        if queue is not None:
            where, params = f"{where} AND queue = %s", [*params, queue]
        cursor.execute(f"SELECT DISTINCT queue FROM {JOB_TABLE} WHERE {where}", params)
        queues = sorted(row[0] for row in cursor.fetchall())
        if not queues:
            return 0, []
        cursor.execute(
            f"UPDATE {JOB_TABLE} SET run_at = {now} WHERE {where}", [*now_params, *params]
        )
        return cursor.rowcount, queues

    def dead_ids(self, queue: str, after_id: int, limit: int) -> list[int]:
        """Return up to ``limit`` ids of ``queue``'s dead letters above ``after_id``, ascending."""
        sql = f"SELECT id FROM {DEAD_TABLE} WHERE queue = %s AND id > %s ORDER BY id LIMIT %s"
        return [row[0] for row in self._fetchall(sql, [queue, after_id, limit])]

    def dead_queues(self) -> list[str]:
        """Return the queues that have dead letters, sorted (a probe of their index per queue)."""
        return [row[0] for row in self._fetchall(distinct_queues_sql(DEAD_TABLE), [])]

    def release_dead_windows(self, ids: Sequence[int]) -> None:
        """Delete the ``unique_for_s`` windows of the dead letters ``ids`` (before they leave)."""
        # Led by the ids (a probe of the window's job index each), not by the windows.
        match, params = self.ids_sql(ids)
        self._rowcount(
            f"DELETE FROM {WINDOW_TABLE} WHERE job_id IN (SELECT id FROM {DEAD_TABLE} "
            f"WHERE {match})",
            params,
        )

    def delete_dead(self, ids: Sequence[int]) -> int:
        """Delete the dead letters ``ids`` with their windows and attempt history; return the count.

        The history goes in the same transaction as its dead letter (led by
        the ids: a probe of ``alk_attempt_job`` each), so no attempt row is
        left for the orphan sweep to find.
        """
        self.release_dead_windows(ids)
        match, params = self.ids_sql(ids)
        self._rowcount(
            f"DELETE FROM {ATTEMPT_TABLE} WHERE job_id IN (SELECT id FROM {DEAD_TABLE} "
            f"WHERE {match})",
            params,
        )
        return self._rowcount(f"DELETE FROM {DEAD_TABLE} WHERE {match}", params)

    def purge_dead_batch(self, queue: str, cutoff: datetime, limit: int) -> int:
        """Delete up to ``limit`` of ``queue``'s dead letters that died at or before ``cutoff``.

        Oldest first, on the (queue, died_at) index ``alk_dead_queue_died``;
        their windows and attempt history go with them (``delete_dead``).
        Inside the caller's write transaction.
        """
        sql = (
            f"SELECT id FROM {DEAD_TABLE} WHERE queue = %s AND died_at <= %s "
            "ORDER BY died_at LIMIT %s"
        )
        ids = [row[0] for row in self._fetchall(sql, [queue, self.adapt_datetime(cutoff), limit])]
        return self.delete_dead(ids) if ids else 0

    def purge_dead(self, queue: str, older_than_s: float) -> int:
        """Delete the queue's dead letters that died ``older_than_s`` ago or earlier.

        In batches (``in_batches``), the cutoff fixed once from the database
        clock; what a run leaves (past its cap) goes at the next sweep.
        Returns how many went.
        """
        cutoff = self.database_now() - timedelta(seconds=older_than_s)
        return self.in_batches(functools.partial(self.purge_dead_batch, queue, cutoff))

    def overview(self, now: datetime) -> dict[str, dict[str, Any]]:
        """Return per-queue counts as of ``now`` from three grouped, index-served queries."""
        at = self.adapt_datetime(now)
        stats: dict[str, dict[str, Any]] = {}

        def row_for(queue: str) -> dict[str, Any]:
            return stats.setdefault(
                queue,
                {"pending": 0, "scheduled": 0, "processing": 0, "overdue": 0, "dead": 0,
                 "oldest_pending_at": None},
            )  # fmt: skip

        pending = self._fetchall(
            "SELECT queue, sum(CASE WHEN run_at <= %s THEN 1 ELSE 0 END), "
            "sum(CASE WHEN run_at > %s THEN 1 ELSE 0 END), "
            f"min(CASE WHEN run_at <= %s THEN run_at END) FROM {JOB_TABLE} "
            "WHERE state = 'pending' GROUP BY queue",
            [at, at, at],
        )
        for queue, ready, scheduled, oldest in pending:
            row = row_for(queue)
            row["pending"], row["scheduled"] = int(ready or 0), int(scheduled or 0)
            row["oldest_pending_at"] = self.to_datetime(oldest)
        processing = self._fetchall(
            "SELECT queue, count(*), sum(CASE WHEN claim_expires_at <= %s THEN 1 ELSE 0 END) "
            f"FROM {JOB_TABLE} WHERE state = 'processing' GROUP BY queue",
            [at],
        )
        for queue, count, overdue in processing:
            row = row_for(queue)
            row["processing"], row["overdue"] = int(count), int(overdue or 0)
        for queue, dead in self._fetchall(
            f"SELECT queue, count(*) FROM {DEAD_TABLE} GROUP BY queue", []
        ):
            row_for(queue)["dead"] = int(dead)
        return stats

    # --- retention: one batch per statement, oldest first ------------------------------

    def prune_outcomes(self, cutoff: datetime, limit: int) -> int:
        """Delete up to ``limit`` counters older than ``cutoff`` (``alk_outcome_by_minute``)."""
        at = self.adapt_datetime(cutoff)
        return self.delete_batch(OUTCOME_TABLE, "id", "minute < %s", [at], "minute", limit)

    def prune_results(self, cutoff: datetime, limit: int) -> int:
        """Delete up to ``limit`` kept results expired by ``cutoff`` (``alk_result_expiry``)."""
        at = self.adapt_datetime(cutoff)
        return self.delete_batch(
            RESULT_TABLE, "job_id", "expires_at <= %s", [at], "expires_at", limit
        )

    def purge_workers(self, cutoff: datetime, limit: int) -> int:
        """Delete up to ``limit`` worker rows last seen before ``cutoff`` (``alk_worker_seen``)."""
        at = self.adapt_datetime(cutoff)
        return self.delete_batch(
            WORKER_TABLE, "id", "last_seen_at < %s", [at], "last_seen_at", limit
        )

    def prune_task_results(self, backend: str, cutoff: datetime, limit: int) -> int:
        """Delete up to ``limit`` of ``backend``'s Tasks results finished before ``cutoff``.

        On ``alk_taskres_retention`` (backend, finished_at over finished rows).
        """
        at = self.adapt_datetime(cutoff)
        return self.delete_batch(
            TASK_RESULT_TABLE,
            "id",
            "backend = %s AND finished_at < %s",
            [backend, at],
            "finished_at",
            limit,
        )

    def attempts_after(self, after_id: int, limit: int) -> list[tuple[int, bool]]:
        """Return up to ``limit`` attempts above ``after_id`` by id: (id, whether its job is here).

        A walk of the primary key; each row read probes the live and the dead
        table once by primary key. A job id never comes back once its job and
        its dead letter are gone, so a row found orphaned stays orphaned.
        """
        sql = (
            f"SELECT a.id, CASE WHEN EXISTS (SELECT 1 FROM {JOB_TABLE} j WHERE j.id = a.job_id) "
            f"OR EXISTS (SELECT 1 FROM {DEAD_TABLE} d WHERE d.id = a.job_id) THEN 1 ELSE 0 END "
            f"FROM {ATTEMPT_TABLE} a WHERE a.id > %s ORDER BY a.id LIMIT %s"
        )
        return [(int(i), bool(kept)) for i, kept in self._fetchall(sql, [after_id, limit])]

    def delete_attempts(self, ids: Sequence[int]) -> int:
        """Delete the attempt rows ``ids``; return the count."""
        match, params = self.ids_sql(ids)
        return self._rowcount(f"DELETE FROM {ATTEMPT_TABLE} WHERE {match}", params)
