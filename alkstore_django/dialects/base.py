"""SQL shared by both engines; each vendor supplies its clock, its types and its moves.

Every statement compares against the database's clock, never the app server's,
so a host with a wrong clock can neither claim early nor steal a live claim.
Placeholders are ``%s`` throughout (Django's SQLite cursor converts them), so a
literal percent sign is written ``%%``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from django.db import connections

from ..models import DeadJob, Job
from ..records import EnqueueStamps
from ..records import Job as JobRecord

J = Job._meta.db_table
D = DeadJob._meta.db_table

JOB_COLUMNS = (
    "id",
    "queue",
    "payload",
    "priority",
    "run_at",
    "attempts",
    "max_attempts",
    "visibility_timeout_s",
    "retry_base_s",
    "expires_at",
    "state",
    "worker_id",
    "claim_expires_at",
    "last_error",
    "enqueued_at",
    "generation",
)
JOB_SELECT = ", ".join(JOB_COLUMNS)
# The columns a dead letter copies from its live row (state and the claim
# deadline stay behind; last_error and died_at are written by the move).
DEAD_COPY = (
    "id, queue, payload, priority, run_at, attempts, max_attempts, "
    "visibility_timeout_s, retry_base_s, expires_at, worker_id, enqueued_at, generation"
)
DEAD_COLUMNS = DEAD_COPY + ", last_error, died_at"
# A handle is valid while its row is still under the very claim it was given:
# the generation grows at every claim and nothing resets it.
FENCE = (
    "id = %s AND state = 'processing' AND generation = %s AND worker_id = %s "
    "AND claim_expires_at > {now}"
)


class Dialect:
    """One database alias's SQL. Connections are looked up per call (they are per thread)."""

    vendor = ""

    def __init__(self, using: str) -> None:
        self.using = using

    # --- vendor hooks -------------------------------------------------------

    @contextmanager
    def write_transaction(self) -> Iterator[Any]:
        """Yield a cursor inside a write transaction (joining the caller's, if any)."""
        raise NotImplementedError

    def now_sql(self) -> tuple[str, list[Any]]:
        """Return SQL (and params) for the database's clock in this statement."""
        raise NotImplementedError

    def plus_sql(self, base: str, seconds: str) -> str:
        """Return SQL for the instant ``seconds`` (an SQL expression) after ``base``."""
        raise NotImplementedError

    def json_param(self) -> str:
        raise NotImplementedError

    def enqueue(self, stamps: EnqueueStamps, payloads: Sequence[str]) -> list[int]:
        """Insert one job per payload in one statement; return the ids in payload order."""
        raise NotImplementedError

    def claim(self, queue: str, worker_id: str, n: int) -> list[JobRecord]:
        raise NotImplementedError

    def bury(self, where: str, params: list[Any], error: str) -> int:
        """Move the live rows matching ``where`` to the dead letters with ``error``.

        ``where`` may end with one ``{now}``, the database clock; ``params``
        fill the ``%s`` before it.
        """
        raise NotImplementedError

    def ack_many(self, queue: str, ids: Sequence[int]) -> int:
        raise NotImplementedError

    def ack_fenced(self, worker_id: str, fences: Sequence[tuple[int, int]]) -> list[int]:
        """Delete each (id, generation) still under ``worker_id``'s claim; return the ids."""
        raise NotImplementedError

    def claim_and_ack(
        self,
        queue: str,
        worker_id: str,
        n: int,
        ack_worker_id: str,
        fences: Sequence[tuple[int, int]],
    ) -> tuple[list[int], list[JobRecord]]:
        """Ack ``fences`` (as ``ack_fenced`` for ``ack_worker_id``) and claim up to ``n``.

        One transaction (and on PostgreSQL one statement): the acks are durable
        once this returns, and the worker pays one commit per cycle, not three.
        Returns (acked ids, claimed jobs in claim order). ``claim`` is this
        with no fences.
        """
        raise NotImplementedError

    def notify(self, channel: str, payload: str) -> None:
        raise NotImplementedError

    # --- shared helpers -----------------------------------------------------

    @property
    def connection(self) -> Any:
        return connections[self.using]

    def adapt_datetime(self, value: datetime) -> Any:
        return self.connection.ops.adapt_datetimefield_value(value)

    def to_datetime(self, value: Any) -> datetime | None:
        return value

    @staticmethod
    def load_json(value: Any) -> Any:
        return json.loads(value) if isinstance(value, str | bytes) else value

    def job_from_row(self, row: Sequence[Any]) -> JobRecord:
        dt = self.to_datetime
        return JobRecord(
            id=row[0],
            queue=row[1],
            payload=self.load_json(row[2]),
            priority=row[3],
            run_at=dt(row[4]),  # type: ignore[arg-type]
            attempts=row[5],
            max_attempts=row[6],
            visibility_timeout_s=row[7],
            retry_base_s=row[8],
            expires_at=dt(row[9]),
            state=row[10],
            worker_id=row[11],
            claim_expires_at=dt(row[12]),
            last_error=row[13],
            enqueued_at=dt(row[14]),  # type: ignore[arg-type]
            generation=row[15],
        )

    def execute(self, sql: str, params: Sequence[Any]) -> Any:
        cursor = self.connection.cursor()
        cursor.execute(sql, list(params))
        return cursor

    def fence_where(self, now: str) -> str:
        return FENCE.format(now=now)

    # --- handle operations: one statement each --------------------------------

    def ack(self, job_id: int, generation: int, worker_id: str) -> bool:
        now, now_params = self.now_sql()
        sql = f"DELETE FROM {J} WHERE {self.fence_where(now)}"
        with self.connection.cursor() as cursor:
            cursor.execute(sql, [job_id, generation, worker_id, *now_params])
            return cursor.rowcount == 1

    def heartbeat(self, job_id: int, generation: int, worker_id: str, extend_s: float) -> bool:
        now, now_params = self.now_sql()
        sql = (
            f"UPDATE {J} SET claim_expires_at = {self.plus_sql(now, '%s')} "
            f"WHERE {self.fence_where(now)}"
        )
        with self.connection.cursor() as cursor:
            cursor.execute(sql, [*now_params, extend_s, job_id, generation, worker_id, *now_params])
            return cursor.rowcount == 1

    def requeue_claimed(
        self,
        job_id: int,
        generation: int,
        worker_id: str,
        *,
        delay_s: float | None,
        error: str | None,
    ) -> bool:
        """Put a claimed row back to pending.

        With ``delay_s`` it is a retry: due after the delay, the claim's attempt
        kept. Without, it is a release: due where it was, the attempt given back.
        """
        now, now_params = self.now_sql()
        sets = ["state = 'pending'", "worker_id = NULL", "claim_expires_at = NULL"]
        params: list[Any] = []
        if error is not None:
            sets.append("last_error = %s")
            params.append(error)
        if delay_s is None:
            sets.append("attempts = attempts - 1")
        else:
            sets.append(f"run_at = {self.plus_sql(now, '%s')}")
            params += [*now_params, delay_s]
        sql = f"UPDATE {J} SET {', '.join(sets)} WHERE {self.fence_where(now)}"
        with self.connection.cursor() as cursor:
            cursor.execute(sql, [*params, job_id, generation, worker_id, *now_params])
            return cursor.rowcount == 1

    def bury_claimed(self, job_id: int, generation: int, worker_id: str, error: str) -> bool:
        return self.bury(FENCE, [job_id, generation, worker_id], error) == 1

    def cancel(self, queue: str, job_id: int) -> bool:
        with self.connection.cursor() as cursor:
            cursor.execute(f"DELETE FROM {J} WHERE id = %s AND queue = %s", [job_id, queue])
            return cursor.rowcount == 1

    def expire(self, queue: str) -> int:
        return self.bury("queue = %s AND expires_at <= {now}", [queue], "expired")

    def bury_exhausted_lapsed(self) -> int:
        """Dead-letter every lapsed claim with no attempts left, whatever its queue.

        A claim on a queue buries that queue's exhausted lapsed claims first;
        this catches those of a queue that nobody claims from any more.
        """
        return self.bury(
            "state = 'processing' AND attempts >= max_attempts AND claim_expires_at <= {now}",
            [],
            "max attempts exceeded",
        )

    def purge_dead(self, queue: str, older_than_s: float) -> int:
        now, now_params = self.now_sql()
        cutoff = self.plus_sql(now, "%s")
        with self.connection.cursor() as cursor:
            cursor.execute(
                f"DELETE FROM {D} WHERE queue = %s AND died_at <= {cutoff}",
                [queue, *now_params, -older_than_s],
            )
            return cursor.rowcount

    def stats(self, queue: str) -> tuple[int, int, int, int, int, float | None]:
        """Return pending (ready), scheduled, processing, overdue, dead, oldest ready age."""
        now, now_params = self.now_sql()
        live = f"FROM {J} WHERE queue = %s AND state ="
        sql = (
            f"SELECT (SELECT count(*) {live} 'pending' AND run_at <= {now}), "
            f"(SELECT count(*) {live} 'pending' AND run_at > {now}), "
            f"(SELECT count(*) {live} 'processing'), "
            f"(SELECT count(*) {live} 'processing' AND claim_expires_at <= {now}), "
            f"(SELECT count(*) FROM {D} WHERE queue = %s), "
            f"(SELECT min(run_at) {live} 'pending' AND run_at <= {now}), {now}"
        )
        params = [
            queue, *now_params,
            queue, *now_params,
            queue,
            queue, *now_params,
            queue,
            queue, *now_params,
            *now_params,
        ]  # fmt: skip
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
        oldest, db_now = self.to_datetime(row[5]), self.to_datetime(row[6])
        age = (db_now - oldest).total_seconds() if oldest and db_now else None
        return row[0], row[1], row[2], row[3], row[4], age

    def next_due_at(self, queues: Sequence[str]) -> float | None:
        """Return seconds until something in ``queues`` next becomes claimable.

        That is the soonest future ``run_at`` of a pending job or the soonest
        claim deadline of a processing one (a dead worker's job comes back
        then); None when there is neither. A future ``run_at`` is always past
        the job's ``enqueued_at`` (both from the database clock), which is what
        lets ``alk_job_due`` leave the jobs due at once out.
        """
        now, now_params = self.now_sql()
        marks = ", ".join(["%s"] * len(queues))
        sql = (
            f"SELECT (SELECT min(run_at) FROM {J} WHERE queue IN ({marks}) "
            f"AND state = 'pending' AND run_at > enqueued_at AND run_at > {now}), "
            f"(SELECT min(claim_expires_at) FROM {J} WHERE queue IN ({marks}) "
            f"AND state = 'processing' AND claim_expires_at > {now}), {now}"
        )
        with self.connection.cursor() as cursor:
            cursor.execute(sql, [*queues, *now_params, *queues, *now_params, *now_params])
            row = cursor.fetchone()
        db_now = self.to_datetime(row[2])
        times = [t for t in (self.to_datetime(row[0]), self.to_datetime(row[1])) if t]
        if not times or db_now is None:
            return None
        return max((min(times) - db_now).total_seconds(), 0.0)

    def database_now(self) -> datetime:
        now, now_params = self.now_sql()
        with self.connection.cursor() as cursor:
            cursor.execute(f"SELECT {now}", now_params)
            return self.to_datetime(cursor.fetchone()[0])  # type: ignore[return-value]
