"""Cancel a live job: at once when nothing runs it, by a durable request when a worker does.

A pending job (or one whose claim has lapsed: no worker can settle it any
more) is deleted, as ``cancel`` (``Queue.cancel``'s) deletes any live job.
A job under a live claim keeps its row: ``cancel_requested_at`` is stamped,
and the worker that holds it reads that column (on a notification, and on
its poll) and stops the run.
The row is locked first, so a claim or an outcome cannot move it between
the read and the write.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Any

from .base import JOB_TABLE, WINDOW_TABLE, Dialect
from .claims import FENCE

# The notification a cancel request sends on its job's queue channel, then the job's id.
CANCEL_PAYLOAD_PREFIX = "alkstore:cancel:"


class CancelResult(StrEnum):
    """What ``cancel_live`` did: deleted the job, or asked its worker to stop it."""

    CANCELLED = "cancelled"
    REQUESTED = "requested"


class CancelStatements(Dialect):
    """The cancel statements, written once for every engine."""

    #: How a transaction locks the row it reads ("" where the write lock serializes: SQLite).
    row_lock_sql: str

    def cancel_live(self, job_id: int) -> tuple[str, CancelResult] | None:
        """Cancel live job ``job_id``; return its queue and what was done, or None when none.

        Joins the caller's transaction (the caller notifies the queue's
        channel in it when a request was recorded). A request keeps the time
        of the first one.
        """
        now, now_params = self.now_sql()
        with self.write_transaction() as cursor:
            cursor.execute(
                f"SELECT queue FROM {JOB_TABLE} WHERE id = %s{self.row_lock_sql}", [job_id]
            )
            row = cursor.fetchone()
            if row is None:
                return None
            unclaimed = f"id = %s AND (state = 'pending' OR claim_expires_at <= {now})"
            if self._delete_cancelled(cursor, job_id, unclaimed, [job_id, *now_params]):
                return row[0], CancelResult.CANCELLED
            cursor.execute(
                f"UPDATE {JOB_TABLE} SET cancel_requested_at = "
                f"COALESCE(cancel_requested_at, {now}) WHERE id = %s",
                [*now_params, job_id],
            )
            return row[0], CancelResult.REQUESTED

    def cancel(self, queue: str, job_id: int) -> bool:
        """Delete a live job of ``queue`` whatever its state, and free its unique key."""
        with self.write_transaction() as cursor:
            return self._delete_cancelled(cursor, job_id, "id = %s AND queue = %s", [job_id, queue])

    def cancel_claimed(self, job_id: int, generation: int, worker_id: str) -> bool:
        """Delete the job if it is still under this claim, and free its unique key."""
        now, now_params = self.now_sql()
        fence = [job_id, generation, worker_id, *now_params]
        with self.write_transaction() as cursor:
            return self._delete_cancelled(cursor, job_id, FENCE.format(now=now), fence)

    @staticmethod
    def _delete_cancelled(cursor: Any, job_id: int, where: str, params: Sequence[Any]) -> bool:
        """Delete live job ``job_id`` if it matches ``where`` (which names it); True when it did.

        A cancelled job did not succeed: its ``unique_for_s`` window goes too,
        in the same transaction.
        """
        cursor.execute(f"DELETE FROM {JOB_TABLE} WHERE {where}", list(params))
        if cursor.rowcount != 1:
            return False
        cursor.execute(f"DELETE FROM {WINDOW_TABLE} WHERE job_id = %s", [job_id])
        return True

    def cancels_requested(self, fences: Sequence[tuple[int, int]]) -> set[tuple[int, int]]:
        """Return which of the claims ``fences`` (id, generation) have a cancel request."""
        if not fences:
            return set()
        match, params = self.ids_sql([job_id for job_id, _ in fences])
        rows = self._fetchall(
            f"SELECT id, generation FROM {JOB_TABLE} "
            f"WHERE {match} AND cancel_requested_at IS NOT NULL",
            params,
        )
        wanted = set(fences)
        return {(int(i), int(g)) for i, g in rows if (int(i), int(g)) in wanted}
