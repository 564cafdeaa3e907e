"""Coordination SQL: named leases (locks) and schedule registration.

Kept beside ``base.py`` so the queue's hot paths stay readable on their own.
Both engines speak the same ``INSERT … ON CONFLICT … DO UPDATE … WHERE …
RETURNING`` (SQLite since 3.35), so one statement takes, renews or refuses a
lease atomically; only the clock, the JSON parameter and the value types differ.
Every timestamp is the database's clock (``Dialect.now_sql()``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ..models import Lock, Schedule
from .base import Dialect

L = Lock._meta.db_table
S = Schedule._meta.db_table

# The lease is kept by its owner while unexpired; anyone may take it once it
# has expired (or been released, which expires it at once). Every take that is
# not the live owner renewing is a change of hands and bumps the fence.
_RENEWING = "l.owner = excluded.owner AND l.expires_at > excluded.acquired_at"


class CoordinationSQL:
    """The lease and schedule statements for one database alias."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect

    @property
    def connection(self) -> Any:
        return self.dialect.connection

    def json_sql(self) -> str:
        """Return the placeholder for one JSON-text parameter."""
        return "%s::jsonb" if self.dialect.vendor == "postgresql" else "%s"

    # --- leases ---------------------------------------------------------------

    def acquire_lock(self, name: str, owner: str, ttl_s: float) -> tuple[int, datetime] | None:
        """Take or renew the lease ``name`` for ``owner``; return (fence, expires_at) or None.

        None means another owner holds an unexpired lease.
        """
        now, now_params = self.dialect.now_sql()
        expires = self.dialect.plus_sql(now, "%s")
        sql = (
            f"INSERT INTO {L} AS l (name, owner, fence, expires_at, acquired_at) "
            f"VALUES (%s, %s, 1, {expires}, {now}) "
            "ON CONFLICT (name) DO UPDATE SET "
            f"fence = CASE WHEN {_RENEWING} THEN l.fence ELSE l.fence + 1 END, "
            f"acquired_at = CASE WHEN {_RENEWING} THEN l.acquired_at "
            "ELSE excluded.acquired_at END, "
            "owner = excluded.owner, expires_at = excluded.expires_at "
            "WHERE l.owner = excluded.owner OR l.expires_at <= excluded.acquired_at "
            "RETURNING fence, expires_at"
        )
        params = [name, owner, *now_params, float(ttl_s), *now_params]
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
        if row is None:
            return None
        return int(row[0]), self.dialect.to_datetime(row[1])  # type: ignore[return-value]

    def renew_lock(self, name: str, owner: str, fence: int, ttl_s: float) -> datetime | None:
        """Reset an unexpired lease to now + ``ttl_s``; return the new expiry, or None if lost."""
        now, now_params = self.dialect.now_sql()
        sql = (
            f"UPDATE {L} SET expires_at = {self.dialect.plus_sql(now, '%s')} "
            f"WHERE name = %s AND owner = %s AND fence = %s AND expires_at > {now} "
            "RETURNING expires_at"
        )
        params = [*now_params, float(ttl_s), name, owner, fence, *now_params]
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
        return None if row is None else self.dialect.to_datetime(row[0])

    def release_lock(self, name: str, owner: str, fence: int) -> bool:
        """Expire an unexpired lease now; False when it was already lost.

        The row stays so the fence keeps growing across releases.
        """
        now, now_params = self.dialect.now_sql()
        sql = (
            f"UPDATE {L} SET expires_at = {now} "
            f"WHERE name = %s AND owner = %s AND fence = %s AND expires_at > {now}"
        )
        with self.connection.cursor() as cursor:
            cursor.execute(sql, [*now_params, name, owner, fence, *now_params])
            return cursor.rowcount == 1

    # --- schedules ------------------------------------------------------------

    def upsert_schedule(self, values: dict[str, Any], next_run_at: datetime) -> None:
        """Insert or update the schedule ``values["name"]`` in one statement.

        ``values`` holds name, spec, interval_s, queue, payload (JSON text) and
        the resolved stamps. An unchanged spec keeps the stored ``next_run_at``;
        a changed one takes ``next_run_at``. ``enabled`` survives re-registration.
        """
        now, now_params = self.dialect.now_sql()
        sql = (
            f"INSERT INTO {S} AS s (name, spec, interval_s, queue, payload, priority, "
            "max_attempts, visibility_timeout_s, retry_base_s, expires_s, enabled, "
            "next_run_at, last_fired_at, created_at, updated_at) "
            f"VALUES (%s, %s, %s, %s, {self.json_sql()}, %s, %s, %s, %s, %s, %s, %s, NULL, "
            f"{now}, {now}) "
            "ON CONFLICT (name) DO UPDATE SET spec = excluded.spec, "
            "interval_s = excluded.interval_s, queue = excluded.queue, "
            "payload = excluded.payload, priority = excluded.priority, "
            "max_attempts = excluded.max_attempts, "
            "visibility_timeout_s = excluded.visibility_timeout_s, "
            "retry_base_s = excluded.retry_base_s, expires_s = excluded.expires_s, "
            "updated_at = excluded.updated_at, "
            "next_run_at = CASE WHEN s.spec = excluded.spec THEN s.next_run_at "
            "ELSE excluded.next_run_at END"
        )
        params = [
            values["name"], values["spec"], values["interval_s"], values["queue"],
            values["payload"], values["priority"], values["max_attempts"],
            values["visibility_timeout_s"], values["retry_base_s"], values["expires_s"],
            True, self.dialect.adapt_datetime(next_run_at), *now_params, *now_params,
        ]  # fmt: skip
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)

    def seconds_until_next_fire(self) -> float | None:
        """Return seconds until the soonest enabled schedule is due (0 if one is), or None."""
        now, now_params = self.dialect.now_sql()
        sql = f"SELECT min(next_run_at), {now} FROM {S} WHERE enabled = %s"
        with self.connection.cursor() as cursor:
            cursor.execute(sql, [*now_params, True])
            row = cursor.fetchone()
        soonest, db_now = self.dialect.to_datetime(row[0]), self.dialect.to_datetime(row[1])
        if soonest is None or db_now is None:
            return None
        return max((soonest - db_now).total_seconds(), 0.0)


def coordination_for(dialect: Dialect) -> CoordinationSQL:
    """Return the lease and schedule statements for ``dialect``."""
    return CoordinationSQL(dialect)
