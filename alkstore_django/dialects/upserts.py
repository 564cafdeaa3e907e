"""The upserts of the engines that speak ``INSERT … ON CONFLICT … RETURNING``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from .base import LOCK_TABLE, SCHEDULE_COLUMNS, SCHEDULE_TABLE, Dialect


class OnConflictUpserts(Dialect):
    """The upserts of the engines that speak ``INSERT … ON CONFLICT … RETURNING``.

    PostgreSQL, and SQLite since 3.35: one statement takes, renews or refuses
    a lease atomically and says which it did. MySQL has neither, and writes
    its own (``mysql/upserts.py``).
    """

    def acquire_lock(self, name: str, owner: str, ttl_s: float) -> tuple[int, datetime] | None:
        now, now_params = self.now_sql()
        renewing = "l.owner = excluded.owner AND l.expires_at > excluded.acquired_at"
        sql = (
            f"INSERT INTO {LOCK_TABLE} AS l (name, owner, fence, expires_at, acquired_at) "
            f"VALUES (%s, %s, 1, {self.plus_sql(now, '%s')}, {now}) "
            "ON CONFLICT (name) DO UPDATE SET "
            f"fence = CASE WHEN {renewing} THEN l.fence ELSE l.fence + 1 END, "
            f"acquired_at = CASE WHEN {renewing} THEN l.acquired_at "
            "ELSE excluded.acquired_at END, "
            "owner = excluded.owner, expires_at = excluded.expires_at "
            "WHERE l.owner = excluded.owner OR l.expires_at <= excluded.acquired_at "
            "RETURNING fence, expires_at"
        )
        rows = self._fetchall(sql, [name, owner, *now_params, float(ttl_s), *now_params])
        if not rows:
            return None
        return int(rows[0][0]), self.to_datetime(rows[0][1])  # type: ignore[return-value]

    def renew_lock(self, name: str, owner: str, fence: int, ttl_s: float) -> datetime | None:
        now, now_params = self.now_sql()
        sql = (
            f"UPDATE {LOCK_TABLE} SET expires_at = {self.plus_sql(now, '%s')} "
            f"WHERE name = %s AND owner = %s AND fence = %s AND expires_at > {now} "
            "RETURNING expires_at"
        )
        rows = self._fetchall(sql, [*now_params, float(ttl_s), name, owner, fence, *now_params])
        return self.to_datetime(rows[0][0]) if rows else None

    def upsert_schedule(self, values: dict[str, Any], next_run_at: datetime) -> None:
        now, now_params = self.now_sql()
        same = "s.spec = excluded.spec AND s.zone = excluded.zone"
        sql = (
            f"INSERT INTO {SCHEDULE_TABLE} AS s ({SCHEDULE_COLUMNS}, created_at, updated_at) "
            f"VALUES (%s, %s, %s, %s, %s, %s, {self.json_sql()}, %s, %s, %s, %s, %s, %s, %s, %s, "
            f"{now}, {now}) "
            "ON CONFLICT (name) DO UPDATE SET spec = excluded.spec, "
            "interval_s = excluded.interval_s, zone = excluded.zone, "
            "misfire = excluded.misfire, queue = excluded.queue, "
            "payload = excluded.payload, priority = excluded.priority, "
            "max_attempts = excluded.max_attempts, "
            "visibility_timeout_s = excluded.visibility_timeout_s, "
            "retry_base_s = excluded.retry_base_s, expires_s = excluded.expires_s, "
            "declared = excluded.declared, admin_edited_at = NULL, "
            "updated_at = excluded.updated_at, "
            f"next_run_at = CASE WHEN {same} THEN s.next_run_at ELSE excluded.next_run_at END, "
            f"refused_from = CASE WHEN {same} THEN s.refused_from ELSE NULL END"
        )
        self._rowcount(sql, [*schedule_params(self, values, next_run_at), *now_params, *now_params])


def schedule_params(dialect: Dialect, values: dict[str, Any], next_run_at: datetime) -> list[Any]:
    """Return the schedule upsert's row values, in column order (name … next_run_at)."""
    return [
        values["name"], values["spec"], values["interval_s"], values["zone"],
        values["misfire"], values["queue"], values["payload"], values["priority"],
        values["max_attempts"], values["visibility_timeout_s"], values["retry_base_s"],
        values["expires_s"], True, values["declared"], dialect.adapt_datetime(next_run_at),
    ]  # fmt: skip
