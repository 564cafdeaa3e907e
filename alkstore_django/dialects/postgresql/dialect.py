"""PostgreSQL: ``FOR UPDATE SKIP LOCKED`` claims, single-statement moves, ``NOTIFY`` wake-ups.

The hot statements run prepared (``prepared.py``); the wake-ups are coalesced
per process (``wakeups.py``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from functools import cache, cached_property, partial
from typing import Any

from django.core import checks
from django.db import DatabaseError, transaction

from ...conf import app_settings
from ...records import EnqueueStamps
from ...records import Job as JobRecord
from ..base import (
    DEAD_COLUMNS,
    DEAD_COPY,
    DEAD_TABLE,
    ENQUEUE_COLUMNS,
    JOB_SELECT,
    JOB_TABLE,
    OUTCOME_TABLE,
    REQUEUE_COLUMNS,
    REQUEUE_SELECT,
    STAMP_MARKS,
    WORKER_TABLE,
    Dialect,
    Watcher,
)
from ..cancels import CancelStatements
from ..claims import ClaimStatements
from ..controls import PAUSED, ControlStatements
from ..leases import LeaseStatements
from ..operators import OperatorStatements
from ..schedules import ScheduleStatements
from ..unique import UniqueJobs
from ..upserts import OnConflictUpserts
from . import partitions
from .autovacuum import reset_autovacuum, set_autovacuum
from .prepared import PreparedStatements
from .wakeups import Wakeups
from .watch import PostgresWatcher

NOW = "statement_timestamp()"
# The claim that acks of known ids must still hold. It is tested inside IS
# TRUE so that the planner cannot answer it from alk_job_lapse: from the
# generic plan's estimate (few rows in processing) it would, and read every
# claim in flight and every index entry left since the last vacuum, so an
# ack of 32 jobs cost more with every job run since (a third of a claim's
# round trip after 20,000 jobs). The ids find their rows by primary key.
LIVE_CLAIM = f"(j.state = 'processing' AND j.claim_expires_at > {NOW}) IS TRUE"
# Delete the rows still under the claims given by a worker: %s ids, then the
# fences as a JSON object {"id": generation}. The ids find the rows by primary
# key; each row's generation is then looked up in the object (a binary search
# of its keys), so the ack stays linear in the batch. A join on
# unnest(ids, generations) re-read the function's rows for every row: an ack of
# 100 cost twice as much per job as an ack of 32, and one of 1,000 fifty times.
FENCED_ACK = (
    f"DELETE FROM {JOB_TABLE} j WHERE j.id = ANY(%s::bigint[]) "
    "AND j.generation = (%s::jsonb ->> j.id::text)::bigint "
    f"AND j.worker_id = %s AND {LIVE_CLAIM} RETURNING j.id"
)

logger = logging.getLogger("alkstore_django.dialects.postgresql")


def _plus(base: str, seconds: str) -> str:
    return f"({base} + make_interval(secs => {seconds}))"


def fence_params(fences: Sequence[tuple[int, int]]) -> list[str]:
    """Return ``FENCED_ACK``'s first two parameters for ``fences`` (id, generation).

    The ids go as one ``bigint[]`` literal (psycopg would adapt a list an
    element at a time) and the generations as the JSON object the ack looks
    them up in.
    """
    ids = "{" + ",".join(str(job_id) for job_id, _ in fences) + "}"
    generations = "{" + ",".join(f'"{job_id}":{generation}' for job_id, generation in fences) + "}"
    return [ids, generations]


def _row_values(when: str, expires: bool) -> str:
    """The enqueued row's values after queue and payload, for one shape of batch."""
    run_at = {"now": NOW, "delay": _plus(NOW, "%s::float8"), "at": "%s::timestamptz"}[when]
    expires_at = _plus(NOW, "%s::float8") if expires else "NULL"
    return f"%s, {run_at}, 0, {STAMP_MARKS}, {expires_at}, 'pending', {NOW}"


# A queue's wake-up, sent only while one of its workers waits (``Wakeups``):
# %s the queue, then its channel. The value says whether it was sent.
WAKE_IF_WAITING = (
    f"CASE WHEN EXISTS (SELECT 1 FROM {WORKER_TABLE} w WHERE w.waiting AND w.queues ? %s) "
    "THEN (SELECT true FROM pg_notify(%s, '')) ELSE false END"
)


@cache
def _enqueue_sql(single: bool, when: str, expires: bool, wake: str) -> str:
    """The enqueue statement for one shape of batch (a handful exist; each is prepared once).

    One statement writes the rows and queues the wake-up, so they commit
    together; a notification sent inside the caller's transaction is
    delivered only on commit, and PostgreSQL folds repeats into one. One row
    returns its id and its wake-up in ``RETURNING``; many rows go through a
    CTE so the ids come back in payload order and the wake-up runs once.
    ``wake`` is ``waiting`` (``WAKE_IF_WAITING``: each row says whether it
    was sent), ``always`` (``pg_notify``) or ``none`` (left to a recent one,
    ``wakeups.py``).
    """
    columns = f"INSERT INTO {JOB_TABLE} ({ENQUEUE_COLUMNS})"
    values = _row_values(when, expires)
    sent = {"waiting": WAKE_IF_WAITING, "always": "pg_notify(%s, '')", "none": ""}[wake]
    if single:
        return f"{columns} VALUES (%s, %s::jsonb, {values}) RETURNING id{sent and ', '}{sent}"
    woken = f", (SELECT {sent} AS w) AS n" if sent else ""
    return (
        f"WITH ins AS ({columns} SELECT %s, u.p::jsonb, {values} "
        "FROM unnest(%s::text[]) WITH ORDINALITY AS u(p, o) ORDER BY u.o RETURNING id) "
        f"SELECT ins.id{', n.w' if sent else ''} FROM ins{woken} ORDER BY ins.id"
    )


class PostgresDialect(
    PreparedStatements,
    ClaimStatements,
    CancelStatements,
    UniqueJobs,
    ControlStatements,
    OperatorStatements,
    LeaseStatements,
    ScheduleStatements,
    OnConflictUpserts,
    Dialect,
):
    """PostgreSQL 13+ through psycopg 3."""

    vendor = "postgresql"
    supports_skip_locked = True
    supports_listen_notify = True
    supports_update_returning = True
    supports_dead_letter_partitions = True

    def __init__(self, using: str) -> None:
        super().__init__(using)
        self.wakeups = Wakeups()

    @classmethod
    def tune_storage(cls, schema_editor: Any) -> None:
        set_autovacuum(schema_editor)

    @classmethod
    def untune_storage(cls, schema_editor: Any) -> None:
        reset_autovacuum(schema_editor)

    @classmethod
    def check_settings(cls, alias: str, config: dict[str, Any]) -> list[checks.CheckMessage]:
        """Refuse a site whose Django talks to PostgreSQL through psycopg2 only.

        alkstore prepares its statements and listens through psycopg 3; a
        site on psycopg2 is not switched over behind its back.
        """
        try:
            import psycopg  # noqa: F401
        except ImportError as exc:
            return [
                checks.Error(
                    f"ALKSTORE['DATABASE'] {alias!r} is PostgreSQL, and psycopg 3 cannot be "
                    f"imported ({exc}).",
                    hint=(
                        "alkstore_django talks to PostgreSQL through psycopg 3 (psycopg2 is "
                        "not enough): pip install 'alkstore-django[postgres]'."
                    ),
                    obj="settings.DATABASES",
                    id="alkstore.E202",
                )
            ]
        return []

    def now_sql(self) -> tuple[str, list[Any]]:
        return NOW, []

    def plus_sql(self, base: str, seconds: str) -> str:
        return _plus(base, seconds)

    def ids_sql(self, ids: Sequence[int]) -> tuple[str, list[Any]]:
        return "id = ANY(%s::bigint[])", [list(ids)]

    def json_sql(self) -> str:
        return "%s::jsonb"

    def open_watcher(
        self,
        channels: Sequence[str],
        *,
        queues: Sequence[str] = (),
        listen_alias: str | None = None,
    ) -> Watcher:
        return PostgresWatcher(listen_alias or self.using, list(channels))

    @staticmethod
    def _stamp_values(stamps: EnqueueStamps) -> tuple[str, list[Any]]:
        """Return the batch's shape (when it is due) and the params of ``_row_values``."""
        params: list[Any] = [stamps.priority]
        if stamps.delay_s is not None:
            when = "delay"
            params.append(stamps.delay_s)
        elif stamps.run_at is not None:
            when = "at"
            params.append(stamps.run_at)
        else:
            when = "now"
        params += stamps.stamp_params()
        if stamps.expires_s is not None:
            params.append(stamps.expires_s)
        return when, params

    def enqueue(self, stamps: EnqueueStamps, payloads: Sequence[str]) -> list[int]:
        when, params = self._stamp_values(stamps)
        if stamps.run_at is not None and stamps.delay_s is None:
            params[1] = self.adapt_datetime(stamps.run_at)
        single = len(payloads) == 1
        if single:
            params = [stamps.queue, payloads[0], *params]
        else:
            params = [stamps.queue, *params, list(payloads)]
        channel = stamps.channel
        window_s = app_settings.notify_coalesce_s
        sent_at = time.monotonic()
        if window_s <= 0:
            wake = "always"
            params.append(channel)
        elif self.wakeups.quiet(channel, window_s, sent_at):
            wake = "none"
        else:
            wake = "waiting"
            params += [stamps.queue, channel]
        sql = _enqueue_sql(single, when, stamps.expires_s is not None, wake)
        wrapper = self.connection
        rows = self.fetch_prepared(sql, params, keep_cursor=True, wrapper=wrapper)
        if wake != "always":
            woke = wake == "waiting" and bool(rows[0][1])
            settle = (
                channel,
                sent_at,
                wake == "none",
                woke,
                window_s,
                partial(self.wake_if_waiting, stamps.queue, channel),
            )
            if wrapper.autocommit and not wrapper.in_atomic_block:
                # Committed with the statement: settled now, as ``on_commit``
                # would, without its two lookups of the connection (8.5 µs here).
                self.wakeups.settle(*settle)
            else:
                # Dropped with a transaction rolled back.
                wrapper.on_commit(partial(self.wakeups.settle, *settle))
        return [row[0] for row in rows]

    def wake_if_waiting(self, queue: str, channel: str) -> None:
        """Send ``queue``'s wake-up on ``channel`` if one of its workers waits."""
        self._fetchall(f"SELECT {WAKE_IF_WAITING}", [queue, channel])

    def wake_for(self, queue: str, channel: str) -> None:
        """Wake ``queue``'s waiting workers for a release, a retry or a snooze.

        Inside a caller's transaction it goes out after the commit (a failed
        statement would abort the transaction, and the workers would look
        too soon). Best effort: what made the job claimable is committed
        whether or not the wake-up goes out, and without it a worker finds
        the job at its poll.
        """
        if self.connection.in_atomic_block:
            transaction.on_commit(partial(self.wake_for, queue, channel), using=self.using)
            return
        try:
            self.wake_if_waiting(queue, channel)
        except DatabaseError:
            logger.warning("could not wake the workers of queue %s", queue, exc_info=True)

    def insert_unique(
        self, cursor: Any, stamps: EnqueueStamps, keyed: dict[str, str]
    ) -> dict[str, int]:
        # ON CONFLICT DO NOTHING waits for a concurrent insert of the same key
        # and skips the row if that one commits; the index names the conflict.
        when, params = self._stamp_values(stamps)
        cursor.execute(
            f"INSERT INTO {JOB_TABLE} ({ENQUEUE_COLUMNS}, unique_key) "
            f"SELECT %s, u.p::jsonb, {_row_values(when, stamps.expires_s is not None)}, u.k "
            "FROM unnest(%s::text[], %s::text[]) WITH ORDINALITY AS u(p, k, o) ORDER BY u.o "
            "ON CONFLICT (queue, unique_key) WHERE unique_key IS NOT NULL DO NOTHING "
            "RETURNING unique_key, id",
            [stamps.queue, *params, list(keyed.values()), list(keyed)],
        )
        return dict(cursor.fetchall())

    def claim_and_ack(
        self,
        queue: str,
        worker_id: str,
        n: int,
        ack_worker_id: str,
        fences: Sequence[tuple[int, int]],
    ) -> tuple[list[int], list[JobRecord]]:
        # One statement, so one round trip and one commit: the fenced acks and
        # the claim. Every CTE sees one snapshot, so a lapsed row cannot wait
        # for a later statement to become claimable: the candidates are the
        # pending rows and the lapsed rows with attempts left, both locked SKIP
        # LOCKED, and the best n of them are claimed. The CTEs touch disjoint
        # rows: an acked row's claim is live, a lapsed one's has passed.
        params = [*fence_params(fences), ack_worker_id, queue, queue, queue, n, n, worker_id]
        rows = self.fetch_generic(self._claim_sql, params)
        acked: list[int] = []
        jobs = []
        lapsed = False
        codec = app_settings.payload_codec
        for row in rows:
            if row[2] is None:
                acked, lapsed = row[0] or acked, row[1]
            else:
                jobs.append(self.job_from_row(row[2:], codec))
        if lapsed:
            self._move_lapsed(queue)
        jobs.sort(key=lambda job: (-job.priority, job.run_at, job.id))
        return acked, jobs

    def _move_lapsed(self, queue: str) -> None:
        """Settle the lapsed claims of ``queue`` the claim saw and did not take.

        Those with no attempts left go to the dead letters, the others back
        to pending (their handles are already invalid). A statement of its
        own, run only after a claim that saw a lapsed claim (a worker that
        died or stalled): in the claim, its three writes cost every claim
        about 25 µs of the server's time to set up, with nothing to move
        almost always. Until it commits the rows stay lapsed, as they were
        before the claim: any claim still takes them, and any claim that sees
        them moves them. Locked SKIP LOCKED, as the claim locks them.

        In autocommit the claim has committed by now: its jobs are the
        caller's, and a failure here must not keep them from it (unheld,
        their claims would lapse and each be charged an attempt), so it is
        logged and the rows are left to the next claim. Inside the caller's
        transaction a failure aborts it, the claim with it, and is raised.
        """
        try:
            self._rowcount(self._move_lapsed_sql, [queue])
        except DatabaseError:
            if self.connection.in_atomic_block:
                raise
            logger.warning(
                "could not move the lapsed claims of queue %s; the next claim will",
                queue,
                exc_info=True,
            )

    @cached_property
    def _move_lapsed_sql(self) -> str:
        return (
            f"WITH lapsed AS (SELECT j.id, j.attempts < j.max_attempts AS live "
            f"FROM {JOB_TABLE} j WHERE j.queue = %s AND j.state = 'processing' "
            f"AND j.claim_expires_at <= {NOW} FOR UPDATE SKIP LOCKED), "
            # By primary key, as the claim looks its rows up, whatever a
            # generic plan guesses for lapsed.
            f"dead AS (DELETE FROM {JOB_TABLE} j "
            "WHERE j.id = ANY(ARRAY(SELECT id FROM lapsed WHERE NOT live)) RETURNING j.*), "
            f"buried AS (INSERT INTO {DEAD_TABLE} ({DEAD_COLUMNS}) SELECT {DEAD_COPY}, "
            f"'max attempts exceeded', {NOW} FROM dead) "
            f"UPDATE {JOB_TABLE} j SET state = 'pending', worker_id = NULL, "
            "claim_expires_at = NULL WHERE j.id = ANY(ARRAY(SELECT id FROM lapsed WHERE live))"
        )

    @cached_property
    def _claim_sql(self) -> str:
        due = f"(j.expires_at IS NULL OR j.expires_at > {NOW})"
        returning = ", ".join("j." + c for c in JOB_SELECT.split(", "))
        claimed = ", ".join("c." + c for c in JOB_SELECT.split(", "))
        return (
            f"WITH acked AS ({FENCED_ACK}), "
            f"lapsed AS (SELECT j.id, j.priority, j.run_at, j.attempts < j.max_attempts AS live, "
            f"{due} AS due FROM {JOB_TABLE} j WHERE j.queue = %s AND j.state = 'processing' "
            f"AND j.claim_expires_at <= {NOW} FOR UPDATE SKIP LOCKED), "
            # A paused queue claims nothing; its lapsed claims are still settled.
            f"held AS (SELECT {PAUSED} AS paused), "
            f"fresh AS (SELECT j.id, j.priority, j.run_at FROM {JOB_TABLE} j WHERE j.queue = %s "
            f"AND j.state = 'pending' AND j.run_at <= {NOW} AND {due} "
            "AND NOT (SELECT paused FROM held) "
            "ORDER BY j.priority DESC, j.run_at, j.id LIMIT %s FOR UPDATE SKIP LOCKED), "
            "pick AS (SELECT id FROM (SELECT id, priority, run_at FROM fresh UNION ALL "
            "SELECT id, priority, run_at FROM lapsed WHERE live AND due "
            "AND NOT (SELECT paused FROM held)) AS u "
            "ORDER BY priority DESC, run_at, id LIMIT %s), "
            f"c AS (UPDATE {JOB_TABLE} j SET state = 'processing', attempts = j.attempts + 1, "
            "generation = j.generation + 1, "
            f"worker_id = %s, claim_expires_at = {self.plus_sql(NOW, 'j.visibility_timeout_s')} "
            # = ANY(ARRAY(...)) keeps the primary-key lookup in the generic plan a
            # prepared statement settles on; a join on pick there estimates
            # 1000 rows and hash-joins a sequential scan of the whole table.
            f"WHERE j.id = ANY(ARRAY(SELECT id FROM pick)) RETURNING {returning}) "
            # The acked ids come once, on a row of their own (its job columns
            # null), in whatever place: on each claimed row they were decoded
            # (in Python) once per row, a tenth of a no-op job's worker CPU.
            # Beside them, whether the claim saw a lapsed claim: the ones it
            # did not take are then moved by a statement of their own.
            f"SELECT a.ids, a.lapsed, {claimed} "
            "FROM (SELECT array_agg(id) AS ids, EXISTS (SELECT FROM lapsed) AS lapsed "
            "FROM acked) AS a FULL JOIN c ON false"
        )

    def bury(self, where: str, params: list[Any], error: str) -> int:
        sql = (
            f"WITH dead AS (DELETE FROM {JOB_TABLE} WHERE {where.format(now=NOW)} RETURNING *) "
            f"INSERT INTO {DEAD_TABLE} ({DEAD_COLUMNS}) SELECT {DEAD_COPY}, %s, {NOW} FROM dead"
        )
        return self._rowcount(sql, [*params, error])

    def ack_many(self, queue: str, ids: Sequence[int]) -> int:
        sql = (
            f"DELETE FROM {JOB_TABLE} j WHERE j.id = ANY(%s::bigint[]) AND j.queue = %s "
            f"AND {LIVE_CLAIM}"
        )
        return self._rowcount(sql, [list(ids), queue])

    def ack_fenced(self, worker_id: str, fences: Sequence[tuple[int, int]]) -> list[int]:
        rows = self._fetchall(FENCED_ACK, [*fence_params(fences), worker_id])
        return [row[0] for row in rows]

    def notify(self, channel: str, payload: str) -> None:
        self._fetchall("SELECT pg_notify(%s, %s)", [channel, payload])

    # --- the dead letters' day partitions (partitions.py) ------------------------------

    def purge_dead(self, queue: str, older_than_s: float) -> int:
        """Drop the past days whose every dead letter is past retention, then purge the rest.

        The rest goes by the batched purge every engine runs, save the rows
        of the day that will be dropped whole next (``partitions.spared_s``).
        Returns how many of ``queue``'s dead letters went, both ways.
        """
        dropped = partitions.drop_expired(self, queue, older_than_s)
        return dropped + super().purge_dead(queue, partitions.spared_s(self, queue, older_than_s))

    def tend_partitions(self) -> int:
        return partitions.tend(self)

    # --- operators --------------------------------------------------------------------

    def move_dead_to_live(self, cursor: Any, ids: Sequence[int]) -> dict[str, int]:
        # One statement: the rows leave the dead letters and arrive live together.
        sql = (
            f"WITH moved AS (DELETE FROM {DEAD_TABLE} WHERE id = ANY(%s::bigint[]) RETURNING *), "
            f"ins AS (INSERT INTO {JOB_TABLE} ({REQUEUE_COLUMNS}) "
            f"SELECT {REQUEUE_SELECT.format(now=NOW)} FROM moved RETURNING queue) "
            "SELECT queue, count(*) FROM ins GROUP BY queue"
        )
        cursor.execute(sql, [list(ids)])
        return {queue: int(n) for queue, n in cursor.fetchall()}

    def record_outcomes(self, rows: Sequence[tuple[str, int, int, int]]) -> None:
        sql = (
            f"INSERT INTO {OUTCOME_TABLE} AS o (queue, minute, acked, retried, dead) "
            "SELECT u.q, date_trunc('minute', statement_timestamp()), u.a, u.r, u.d "
            "FROM unnest(%s::text[], %s::bigint[], %s::bigint[], %s::bigint[]) AS u(q, a, r, d) "
            "ON CONFLICT (queue, minute) DO UPDATE SET acked = o.acked + excluded.acked, "
            "retried = o.retried + excluded.retried, dead = o.dead + excluded.dead"
        )
        self._rowcount(sql, [list(column) for column in zip(*rows, strict=True)])
