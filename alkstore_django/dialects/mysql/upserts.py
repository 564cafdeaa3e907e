"""MariaDB/MySQL upserts: ``INSERT … ON DUPLICATE KEY UPDATE``, read back in the same transaction.

There is no ``ON CONFLICT … WHERE`` and no ``RETURNING`` on MySQL, so each
column's assignment tests for itself whether the take is allowed, and the
lease is read back to learn who holds it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ..base import (
    LOCK_TABLE,
    OUTCOME_TABLE,
    SCHEDULE_COLUMNS,
    SCHEDULE_TABLE,
    Dialect,
)
from ..upserts import schedule_params
from .sql import NOW, plus
from .transactions import run_in_transaction


class DuplicateKeyUpserts(Dialect):
    """The leases, the schedule upsert and the outcome counters, on ``ON DUPLICATE KEY``."""

    def acquire_lock(self, name: str, owner: str, ttl_s: float) -> tuple[int, datetime] | None:
        # ON DUPLICATE KEY UPDATE has no WHERE: each column keeps its value
        # unless the take is allowed. MySQL applies the assignments left to
        # right, each seeing the ones before it, so fence and acquired_at
        # (which read the old owner and expiry) come first, then owner, then
        # expires_at (whose test then sees the new owner).
        taken = f"(owner = %s OR expires_at <= {NOW})"
        renewing = f"(owner = %s AND expires_at > {NOW})"
        sql = (
            f"INSERT INTO {LOCK_TABLE} (name, owner, fence, expires_at, acquired_at) "
            f"VALUES (%s, %s, 1, {plus(NOW, '%s')}, {NOW}) ON DUPLICATE KEY UPDATE "
            f"fence = IF({renewing}, fence, IF({taken}, fence + 1, fence)), "
            f"acquired_at = IF({renewing}, acquired_at, IF({taken}, {NOW}, acquired_at)), "
            f"owner = IF({taken}, %s, owner), "
            f"expires_at = IF(owner = %s, {plus(NOW, '%s')}, expires_at)"
        )
        ttl = float(ttl_s)
        params = [name, owner, ttl, *[owner] * 7, ttl]

        def body(cursor: Any) -> tuple[int, datetime] | None:
            cursor.execute(sql, params)
            cursor.execute(
                f"SELECT owner, fence, expires_at FROM {LOCK_TABLE} WHERE name = %s", [name]
            )
            held_by, fence, expires_at = cursor.fetchone()
            if held_by != owner:
                return None
            return int(fence), self.to_datetime(expires_at)  # type: ignore[return-value]

        return run_in_transaction(self.connection, body)

    def renew_lock(self, name: str, owner: str, fence: int, ttl_s: float) -> datetime | None:
        def body(cursor: Any) -> datetime | None:
            cursor.execute(
                f"UPDATE {LOCK_TABLE} SET expires_at = {plus(NOW, '%s')} "
                f"WHERE name = %s AND owner = %s AND fence = %s AND expires_at > {NOW}",
                [float(ttl_s), name, owner, fence],
            )
            if cursor.rowcount != 1:
                return None
            cursor.execute(f"SELECT expires_at FROM {LOCK_TABLE} WHERE name = %s", [name])
            return self.to_datetime(cursor.fetchone()[0])

        return run_in_transaction(self.connection, body)

    def upsert_schedule(self, values: dict[str, Any], next_run_at: datetime) -> None:
        # next_run_at and refused_from are assigned before spec and zone, so
        # they compare the stored ones.
        same = "(spec = %s AND zone = %s)"
        sql = (
            f"INSERT INTO {SCHEDULE_TABLE} ({SCHEDULE_COLUMNS}, created_at, updated_at) "
            f"VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, {NOW}, {NOW}) "
            f"ON DUPLICATE KEY UPDATE next_run_at = IF({same}, next_run_at, %s), "
            f"refused_from = IF({same}, refused_from, NULL), "
            "spec = %s, interval_s = %s, zone = %s, misfire = %s, queue = %s, payload = %s, "
            "priority = %s, max_attempts = %s, visibility_timeout_s = %s, retry_base_s = %s, "
            f"expires_s = %s, declared = %s, admin_edited_at = NULL, updated_at = {NOW}"
        )
        row = schedule_params(self, values, next_run_at)
        spec, zone, next_at = row[1], row[3], row[14]
        updates = [*row[1:12], row[13]]
        self._rowcount(sql, [*row, spec, zone, next_at, spec, zone, *updates])

    def record_outcomes(self, rows: Sequence[tuple[str, int, int, int]]) -> None:
        select = " UNION ALL ".join(["SELECT %s AS q, %s AS a, %s AS r, %s AS d"] * len(rows))
        sql = (
            f"INSERT INTO {OUTCOME_TABLE} (queue, minute, acked, retried, dead) "
            "SELECT u.q, DATE_FORMAT(UTC_TIMESTAMP(), '%%Y-%%m-%%d %%H:%%i:00'), u.a, u.r, u.d "
            f"FROM ({select}) AS u ON DUPLICATE KEY UPDATE acked = acked + u.a, "
            "retried = retried + u.r, dead = dead + u.d"
        )
        self._rowcount(sql, [value for row in rows for value in row])
