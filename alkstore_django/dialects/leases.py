"""Leases: the release every engine speaks alike.

Taking and renewing a lease are per engine (``Dialect.acquire_lock``,
``Dialect.renew_lock``): one atomic upsert that says what it did, written
with ``ON CONFLICT`` (``upserts.py``) or MySQL's ``ON DUPLICATE KEY``.
"""

from __future__ import annotations

from .base import LOCK_TABLE, Dialect


class LeaseStatements(Dialect):
    """A lease's release, written once."""

    def release_lock(self, name: str, owner: str, fence: int) -> bool:
        """Expire an unexpired lease now; False when it was already lost.

        The row stays so the fence keeps growing across releases.
        """
        now, now_params = self.now_sql()
        sql = (
            f"UPDATE {LOCK_TABLE} SET expires_at = {now} "
            f"WHERE name = %s AND owner = %s AND fence = %s AND expires_at > {now}"
        )
        return self._rowcount(sql, [*now_params, name, owner, fence, *now_params]) == 1
