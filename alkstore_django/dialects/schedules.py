"""Schedules: the scheduler's statements every engine speaks alike.

A schedule's upsert is per engine (``Dialect.upsert_schedule``); the
boundary arithmetic is Python (``specs.py``), not SQL.
"""

from __future__ import annotations

from datetime import datetime

from .base import FIRE_TABLE, SCHEDULE_TABLE, Dialect


class ScheduleStatements(Dialect):
    """The scheduler's wait and its fired boundaries' pruning, written once."""

    def seconds_until_next_fire(self) -> float | None:
        """Return seconds until the soonest enabled schedule is due (0 if one is), or None."""
        now, now_params = self.now_sql()
        sql = f"SELECT min(next_run_at), {now} FROM {SCHEDULE_TABLE} WHERE enabled = %s"
        row = self._fetchall(sql, [*now_params, True])[0]
        return self._seconds_until(row[0], row[1])

    def prune_fires(self, cutoff: datetime, limit: int) -> int:
        """Delete up to ``limit`` fired boundaries older than ``cutoff``; return the count.

        One batch on ``alk_fire_boundary``, run inside the tick's write
        transaction: a tick that fires deletes at most one batch, so the
        prune keeps up with the fires without lengthening a tick.
        """
        at = self.adapt_datetime(cutoff)
        return self.delete_batch(FIRE_TABLE, "job_id", "boundary < %s", [at], "boundary", limit)
