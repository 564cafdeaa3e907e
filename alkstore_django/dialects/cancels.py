"""Cancel a live job: at once when nothing runs it, by a durable request when a worker does.

A pending job (or one whose claim has lapsed: no worker can settle it any
more) is deleted, as ``cancel`` deletes it. A job under a live claim keeps
its row: ``cancel_requested_at`` is stamped, and the worker that holds it
reads that column (on a notification, and on its poll) and stops the run.
The row is locked first, so a claim or an outcome cannot move it between
the read and the write.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

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
            cursor.execute(
                f"DELETE FROM {JOB_TABLE} WHERE id = %s AND (state = 'pending' "
                f"OR claim_expires_at IS NULL OR claim_expires_at <= {now})",
                [job_id, *now_params],
            )
            if cursor.rowcount == 1:
                # A cancelled job did not succeed: its ``unique_for_s`` window goes too.
                cursor.execute(f"DELETE FROM {WINDOW_TABLE} WHERE job_id = %s", [job_id])
                return row[0], CancelResult.CANCELLED
            cursor.execute(
                f"UPDATE {JOB_TABLE} SET cancel_requested_at = "
                f"COALESCE(cancel_requested_at, {now}) WHERE id = %s",
                [*now_params, job_id],
            )
            return row[0], CancelResult.REQUESTED

    def cancel_claimed(self, job_id: int, generation: int, worker_id: str) -> bool:
        """Delete the job if it is still under this claim, and free its unique key."""
        now, now_params = self.now_sql()
        with self.write_transaction() as cursor:
            cursor.execute(
                f"DELETE FROM {JOB_TABLE} WHERE {FENCE.format(now=now)}",
                [job_id, generation, worker_id, *now_params],
            )
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
