"""MariaDB/MySQL wake-ups: an adaptive short poll, since there is no LISTEN/NOTIFY.

Each poll is one round trip on the watcher's own autocommit connection:

- the ready probe: does any watched queue hold a job that is pending and
  due? An index range on ``alk_job_due`` (queue, run_at) that stops at the
  first hit. Probing the claimable rows themselves, rather than a counter
  that enqueues bump, costs the enqueue nothing, cannot deadlock two
  producers on a hot counter row, and cannot miss a job whose transaction
  took an id before another's and committed after it; it also sees a
  delayed job become due, a requeued dead letter and a released claim.
- the messages ``store.notify`` wrote on the watched channels. Ids are
  handed out at insert, not at commit, so the watcher re-reads a short
  window (``LATE_COMMIT_S``) behind the newest id it has seen and skips the
  ids it already delivered: a notification whose transaction commits later
  than that after sending is not delivered.

The interval drops to ``MIN_POLL_S`` when something new is found (a message,
or a queue turning ready) and grows by ``POLL_GROWTH`` per poll otherwise, up
to ``MAX_POLL_S``: a worker that was busy a moment ago is woken within a few
milliseconds, an idle one, or one draining a standing backlog (which wakes
itself as its jobs finish), costs the server some twenty cheap reads a
second. The watcher also deletes messages older than ``MESSAGE_RETENTION_S``,
so the table stays a short tail.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from typing import Any

import MySQLdb
from django.db import connections

from ..base import JOB_TABLE, MESSAGE_TABLE, Watcher, marks
from .sql import NOW

logger = logging.getLogger("alkstore_django.dialects.mysql_watch")

MIN_POLL_S = 0.002
MAX_POLL_S = 0.05
POLL_GROWTH = 1.1
LATE_COMMIT_S = 5.0
MESSAGE_RETENTION_S = 60
TRIM_INTERVAL_S = 10.0
TRIM_BATCH = 1_000
# Batches per trim (each its own autocommit statement): up to 1,000 messages a
# second per watcher, so the tail stays short under a steady stream of notifies.
TRIM_MAX_BATCHES = 10
# The probe's row in a poll's result: message ids start at 1.
READY = 0


class MysqlWatcher(Watcher):
    """Polls the watched queues' ready jobs and channels' messages; reconnects after a drop."""

    def __init__(self, alias: str, channels: list[str], queues: list[str]) -> None:
        self.alias = alias
        self.channels = channels
        self.queues = queues
        self.interval_s = MIN_POLL_S
        self.reconnects = 0
        self._was_ready = False
        self._conn: Any = None
        self._floor = 0
        self._seen: set[int] = set()
        self._marks: deque[tuple[float, int]] = deque()
        self._next_trim_at = time.monotonic()
        self._sql = self._poll_sql()
        # Messages already there when the watcher opens are not news.
        try:
            self._conn = self._connect()
            self._floor = self._max_message_id()
        except MySQLdb.Error as exc:
            logger.warning("watcher connection failed alias=%s error=%s", alias, exc)

    def _connect(self) -> Any:
        wrapper = connections[self.alias]
        conn = wrapper.get_new_connection(wrapper.get_connection_params())
        conn.autocommit(True)
        return conn

    def _max_message_id(self) -> int:
        with contextlib.closing(self._conn.cursor()) as cursor:
            cursor.execute(f"SELECT max(id) FROM {MESSAGE_TABLE}")
            return int(cursor.fetchone()[0] or 0)

    def _poll_sql(self) -> str:
        parts = []
        if self.queues:
            parts.append(
                f"SELECT {READY}, '', '' FROM DUAL WHERE EXISTS (SELECT 1 FROM {JOB_TABLE} "
                f"WHERE queue IN ({marks(len(self.queues))}) AND run_at <= {NOW} "
                f"AND state = 'pending' AND (expires_at IS NULL OR expires_at > {NOW}))"
            )
        if self.channels:
            parts.append(
                f"SELECT id, channel, payload FROM {MESSAGE_TABLE} "
                f"WHERE channel IN ({marks(len(self.channels))}) AND id > %s"
            )
        return " UNION ALL ".join(parts)

    def _poll(self) -> tuple[bool, list[tuple[str, str]]]:
        """Return (a watched queue has a ready job, the new messages in id order)."""
        params: list[Any] = [*self.queues]
        if self.channels:
            params += [*self.channels, self._floor]
        with contextlib.closing(self._conn.cursor()) as cursor:
            cursor.execute(self._sql, params)
            rows = cursor.fetchall()
        ready = any(row[0] == READY for row in rows)
        fresh = sorted(row for row in rows if row[0] != READY and row[0] not in self._seen)
        self._seen.update(row[0] for row in fresh)
        self._advance_floor(max((row[0] for row in fresh), default=0))
        return ready, [(row[1], row[2]) for row in fresh]

    def _advance_floor(self, newest: int) -> None:
        """Stop re-reading ids that were seen more than ``LATE_COMMIT_S`` ago."""
        now = time.monotonic()
        if newest:
            self._marks.append((now, newest))
        while self._marks and now - self._marks[0][0] > LATE_COMMIT_S:
            self._floor = max(self._floor, self._marks.popleft()[1])
        self._seen = {i for i in self._seen if i > self._floor}

    def _trim(self) -> None:
        if time.monotonic() < self._next_trim_at:
            return
        self._next_trim_at = time.monotonic() + TRIM_INTERVAL_S
        with contextlib.closing(self._conn.cursor()) as cursor:
            for _ in range(TRIM_MAX_BATCHES):
                cursor.execute(
                    f"DELETE FROM {MESSAGE_TABLE} WHERE created_at < "
                    f"{NOW} - INTERVAL {MESSAGE_RETENTION_S} SECOND ORDER BY id LIMIT {TRIM_BATCH}"
                )
                if cursor.rowcount < TRIM_BATCH:
                    break

    def _step(self) -> tuple[bool, list[tuple[str, str]]]:
        """Poll once, reconnecting first if the connection was lost."""
        if self._conn is None:
            self._conn = self._connect()
            self.reconnects += 1
            logger.info("watcher reconnected alias=%s", self.alias)
            # Anything sent while we were away may be missed: report a wake-up.
            return True, []
        self._trim()
        return self._poll()

    def _watch(self, timeout_s: float, *, wake_on_ready: bool) -> list[tuple[str, str]] | None:
        """Poll until something arrives or ``timeout_s`` passes; None means a ready job."""
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self.pause(min(self.interval_s, remaining)):
                return []
            try:
                ready, messages = self._step()
            except MySQLdb.Error as exc:
                logger.warning("watcher connection lost alias=%s error=%s", self.alias, exc)
                self.close()
                time.sleep(min(0.5, max(deadline - time.monotonic(), 0.0)))
                continue
            arrived = messages or (ready and not self._was_ready)
            self._was_ready = ready
            # News resets the pace; a backlog that stays ready does not (the
            # worker is busy draining it and wakes itself), so it backs off.
            self.interval_s = (
                MIN_POLL_S if arrived else min(self.interval_s * POLL_GROWTH, MAX_POLL_S)
            )
            if messages or (ready and wake_on_ready):
                return messages if messages else None

    def receive(self, timeout_s: float) -> list[tuple[str, str]]:
        return self._watch(timeout_s, wake_on_ready=False) or []

    def wait(self, timeout_s: float) -> bool:
        return self._watch(timeout_s, wake_on_ready=True) != []

    def wait_for_payloads(self, timeout_s: float) -> tuple[bool, list[str]]:
        found = self._watch(timeout_s, wake_on_ready=True)
        return found != [], [payload for _, payload in found or ()]

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(MySQLdb.Error):
                self._conn.close()
            self._conn = None
