"""Queue controls: pause and resume, and the claim under ``max_running`` or ``rate``.

A queue's controls live in one ``QueueControl`` row. Every engine's plain
claim tests ``PAUSED`` inside its own statement (PostgreSQL) or write
transaction (SQLite, MariaDB/MySQL), so a claim that starts after a pause
commits claims nothing; no process memory is trusted with it. A limited
queue's claim (``claim_limited``) locks the row first, so those claims take
turns over every worker and host: the count of live claims and the rate
window it reads cannot change under it until it commits.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction

from ..conf import QueueLimits
from ..models import QueueControl
from ..records import Job as JobRecord
from .base import JOB_TABLE, Dialect
from .keys import claim_keyed

CONTROL_TABLE = QueueControl._meta.db_table
# Uncorrelated: the engines evaluate it once per claim, by primary key.
PAUSED = f"EXISTS (SELECT 1 FROM {CONTROL_TABLE} WHERE queue = %s AND paused)"
# The payload of the notification a pause or resume sends on the queue's channel.
CONTROL_PAYLOAD = "alkstore:control"


class ControlStatements(Dialect):
    """The queue-control statements, written once for every engine."""

    #: How a transaction locks the control row it reads ("" where the
    #: transaction's write lock already serializes: SQLite).
    row_lock_sql = " FOR UPDATE"
    #: Insert a queue's control row unless it exists (every column defaults).
    ensure_control_sql = f"INSERT INTO {CONTROL_TABLE} (queue) VALUES (%s) ON CONFLICT DO NOTHING"

    def set_paused(self, queue: str, paused: bool, channel: str) -> bool:
        """Pause or resume ``queue``; return False when it already was.

        A change notifies ``channel`` with ``CONTROL_PAYLOAD`` in the same
        transaction, so listening workers hear of it once it commits.
        """
        now, now_params = self.now_sql()
        stamp = now if paused else "NULL"
        with self.write_transaction() as cursor:
            if paused:
                cursor.execute(self.ensure_control_sql, [queue])
            cursor.execute(
                f"UPDATE {CONTROL_TABLE} SET paused = %s, paused_at = {stamp} "
                "WHERE queue = %s AND paused = %s",
                [paused, *(now_params if paused else []), queue, not paused],
            )
            changed = cursor.rowcount == 1
            if changed:
                self.notify(channel, CONTROL_PAYLOAD)
        return changed

    def paused_queues(self) -> dict[str, datetime | None]:
        """Return every paused queue with the time it was paused."""
        rows = self._fetchall(f"SELECT queue, paused_at FROM {CONTROL_TABLE} WHERE paused", [])
        return {queue: self.to_datetime(at) for queue, at in rows}

    def lock_control(
        self, cursor: Any, queue: str
    ) -> tuple[datetime, bool, datetime | None, int, str | None]:
        """Lock the queue's control row (made if missing).

        Returns (now, paused, window_at, starts, key_cursor). The row is read
        locked first and inserted only when missing, so a claim writes nothing
        it does not change.
        """
        now, now_params = self.now_sql()
        select = (
            f"SELECT {now}, paused, window_at, window_starts, key_cursor FROM {CONTROL_TABLE} "
            f"WHERE queue = %s{self.row_lock_sql}"
        )
        cursor.execute(select, [*now_params, queue])
        row = cursor.fetchone()
        if row is None:
            cursor.execute(self.ensure_control_sql, [queue])
            cursor.execute(select, [*now_params, queue])
            row = cursor.fetchone()
        return self.to_datetime(row[0]), bool(row[1]), self.to_datetime(row[2]), int(row[3]), row[4]  # type: ignore[return-value]

    def claim_limited(
        self,
        queue: str,
        worker_id: str,
        n: int,
        ack_worker_id: str,
        fences: Sequence[tuple[int, int]],
        limits: QueueLimits,
    ) -> tuple[list[int], list[JobRecord], float | None]:
        """``claim_and_ack`` for a queue with limits: (acked, jobs, hold_s).

        One transaction: the acks first (a finished job frees its place),
        then the control row is locked, the live claims counted (a lapsed
        claim does not count) and the rate window read, and at most what
        they allow is claimed: through the engine's own claim, or under
        ``max_running_per_key`` through ``keys.claim_keyed`` once the lapsed
        claims are settled. ``hold_s`` is None when no limit held the claim
        back; else the seconds until the rate window closes, or 0.0 when the
        claim waits for a running job to finish. A paused queue claims
        nothing (and is not held: its workers hear of the resume).
        """
        with transaction.atomic(using=self.using), self.connection.cursor() as cursor:
            acked = self.ack_fenced(ack_worker_id, fences) if fences else []
            now, paused, window_at, starts, key_cursor = self.lock_control(cursor, queue)
            if paused:
                return acked, [], None
            allowed, hold_s = n, None
            if limits.max_running is not None:
                live, live_params = self.now_sql()
                cursor.execute(
                    f"SELECT count(*) FROM {JOB_TABLE} WHERE queue = %s "
                    f"AND state = 'processing' AND claim_expires_at > {live}",
                    [queue, *live_params],
                )
                room = limits.max_running - int(cursor.fetchone()[0])
                if room < allowed:
                    allowed, hold_s = max(room, 0), 0.0
            period = timedelta(seconds=limits.rate_period_s or 0)
            if limits.rate_starts is not None:
                if window_at is None or now >= window_at + period:
                    # The next window opens at its first start.
                    window_at, starts = None, 0
                left = limits.rate_starts - starts
                if left <= allowed:
                    allowed = left
                    hold_s = _until(window_at or now, period, now)
            per_key, blocked = limits.max_running_per_key, False
            if allowed <= 0:
                jobs = []
            elif per_key is None:
                jobs = self.claim_and_ack(queue, worker_id, allowed, "", ())[1]
            else:
                # The engine's claim of nothing settles the lapsed claims first.
                self.claim_and_ack(queue, worker_id, 0, "", ())
                jobs, blocked = claim_keyed(
                    self, cursor, queue, worker_id, allowed, per_key, key_cursor
                )
            if limits.rate_starts is not None and jobs:
                cursor.execute(
                    f"UPDATE {CONTROL_TABLE} SET window_at = %s, window_starts = %s "
                    "WHERE queue = %s",
                    [self.adapt_datetime(window_at or now), starts + len(jobs), queue],
                )
        if len(jobs) < allowed:
            # The queue ran dry before any limit mattered, or its keys with
            # pending jobs are at their limit: then it waits for one to finish.
            hold_s = 0.0 if blocked else None
        return acked, jobs, hold_s


def _until(opened_at: datetime, period: timedelta, now: datetime) -> float:
    return max((opened_at + period - now).total_seconds(), 0.0)
