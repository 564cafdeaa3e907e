"""The vendor contract: every statement alkstore runs, declared once, with its defaults.

``Dialect`` is the one interface between the services and a database engine,
the way Django's ``BaseDatabaseOperations`` is for the ORM. An engine module
(``postgresql.py``, ``sqlite.py``, ``mysql.py``) subclasses it, sets the
capability flags, supplies the hooks (its clock, its interval arithmetic, its
id lists, its transactions) and overrides the statements its SQL cannot share.
The defaults here are the statements all three engines speak alike.

Every statement compares against the database's clock, never the app
server's, so a host with a wrong clock can neither claim early nor steal a
live claim. Placeholders are ``%s`` throughout (Django's SQLite cursor converts
them), so a literal percent sign is written ``%%``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, ClassVar

from django.core import checks
from django.db import connections

from ..conf import QueueLimits, app_settings
from ..models import DeadJob, Job, Lock, OutcomeMinute, Schedule, UniqueWindow
from ..records import EnqueueStamps
from ..records import Job as JobRecord

JOB_TABLE = Job._meta.db_table
DEAD_TABLE = DeadJob._meta.db_table
LOCK_TABLE = Lock._meta.db_table
SCHEDULE_TABLE = Schedule._meta.db_table
OUTCOME_TABLE = OutcomeMinute._meta.db_table
WINDOW_TABLE = UniqueWindow._meta.db_table

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
    "timeout_s",
    "snoozes",
    "max_snoozes",
    "unique_key",
)
JOB_SELECT = ", ".join(JOB_COLUMNS)
_new_record = object.__new__
# The columns a dead letter copies from its live row (state and the claim
# deadline stay behind; last_error and died_at are written by the move).
DEAD_COPY = (
    "id, queue, payload, priority, run_at, attempts, max_attempts, "
    "visibility_timeout_s, retry_base_s, expires_at, worker_id, enqueued_at, generation, "
    "timeout_s, snoozes, max_snoozes, unique_key"
)
DEAD_COLUMNS = DEAD_COPY + ", last_error, died_at"
# A handle is valid while its row is still under the very claim it was given:
# the generation grows at every claim and nothing resets it.
FENCE = (
    "id = %s AND state = 'processing' AND generation = %s AND worker_id = %s "
    "AND claim_expires_at > {now}"
)
# Exhausted lapsed claims: a worker died after the job's last allowed claim.
EXHAUSTED_LAPSED = "state = 'processing' AND attempts >= max_attempts AND claim_expires_at <= {now}"
# What a dead letter becomes when it is requeued: the same id and stamps,
# pending, due now, attempts reset, its last error kept for the operator.
# An expiry that has already passed is dropped: a requeued job is meant to run.
# So is its unique key: another live job may hold it by now, and an operator's
# requeue must not fail on it.
REQUEUE_COLUMNS = JOB_SELECT
REQUEUE_SELECT = (
    "id, queue, payload, priority, {now}, 0, max_attempts, visibility_timeout_s, "
    "retry_base_s, CASE WHEN expires_at > {now} THEN expires_at END, 'pending', NULL, NULL, "
    "last_error, enqueued_at, generation, timeout_s, snoozes, max_snoozes, NULL"
)
# What every engine's enqueue writes: the columns, then the stamps' placeholders
# (``EnqueueStamps.stamp_params`` fills them, in this order).
ENQUEUE_COLUMNS = (
    "queue, payload, priority, run_at, attempts, max_attempts, visibility_timeout_s, "
    "retry_base_s, timeout_s, max_snoozes, expires_at, state, enqueued_at"
)
STAMP_MARKS = "%s, %s, %s, %s, %s"


class Watcher:
    """Waits for wake-ups on a set of channels over its own dedicated connection."""

    def receive(self, timeout_s: float) -> list[tuple[str, str]]:
        """Return the (channel, payload) pairs that arrived within ``timeout_s``."""
        raise NotImplementedError

    def wait(self, timeout_s: float) -> bool:
        """Return True as soon as something may have changed, False on timeout."""
        return bool(self.receive(timeout_s))

    def wait_for_controls(self, timeout_s: float) -> tuple[bool, bool]:
        """Wait as ``wait``; return (woken, a queue was paused or resumed).

        An engine that carries notification payloads to its watcher says when
        one is a pause or resume; others return False and leave the worker to
        read the paused queues on its poll.
        """
        return self.wait(timeout_s), False

    def close(self) -> None:
        """Close the watcher's connection."""
        raise NotImplementedError


class Dialect:
    """One database alias's statements. Connections are looked up per call (they are per thread).

    The capability flags say what the engine can do; code outside
    ``dialects/`` (and the tests) branch on them, never on a vendor name.
    """

    vendor: ClassVar[str] = ""
    #: A claim skips rows another session has locked (``FOR UPDATE SKIP
    #: LOCKED``). Without it a claim takes the database's write lock and
    #: concurrent claimants queue behind one another (SQLite).
    supports_skip_locked: ClassVar[bool] = False
    #: Wake-ups are pushed to a listening session (``LISTEN``/``NOTIFY``).
    #: Without it the watcher polls: the database file (SQLite) or a cheap
    #: probe of the claimable rows (MariaDB/MySQL).
    supports_listen_notify: ClassVar[bool] = False
    #: ``UPDATE … RETURNING``: a claim is one statement that hands back the
    #: rows it claimed. Without it the claim locks its rows, updates them by
    #: primary key and reads them back inside one transaction.
    supports_update_returning: ClassVar[bool] = False

    def __init__(self, using: str) -> None:
        self.using = using

    def __repr__(self) -> str:
        return f"<{type(self).__name__} using={self.using!r}>"

    # --- engine hooks -------------------------------------------------------------

    @classmethod
    def prepare_connection(cls, connection: Any) -> None:
        """Configure a new connection of this vendor (``connection_created``); default: nothing."""

    @classmethod
    def check_settings(cls, alias: str, config: dict[str, Any]) -> list[checks.CheckMessage]:
        """Return system-check warnings about the alias's ``DATABASES`` entry; default: none."""
        return []

    @classmethod
    def prepare_schema(cls, schema_editor: Any, tables: Sequence[str]) -> None:
        """Adjust the app's freshly migrated ``tables`` for this engine; default: nothing."""

    @classmethod
    def unprepare_schema(cls, schema_editor: Any) -> None:
        """Drop what ``prepare_schema`` built on columns a reversed migration removes next.

        Default: nothing (Django drops its own indexes with their columns).
        """

    def server_problem(self) -> str | None:
        """Return why this database server cannot run alkstore (its version), or None."""
        return None

    @contextmanager
    def write_transaction(self) -> Iterator[Any]:
        """Yield a cursor inside a write transaction (joining the caller's, if any)."""
        raise NotImplementedError
        yield  # pragma: no cover

    def now_sql(self) -> tuple[str, list[Any]]:
        """Return SQL (and params) for the database's clock in this statement."""
        raise NotImplementedError

    def plus_sql(self, base: str, seconds: str) -> str:
        """Return SQL for the instant ``seconds`` (an SQL expression) after ``base``."""
        raise NotImplementedError

    def ids_sql(self, ids: Sequence[int]) -> tuple[str, list[Any]]:
        """Return SQL (and params) matching ``id`` against ``ids``."""
        raise NotImplementedError

    def json_sql(self) -> str:
        """Return the placeholder for one JSON-text parameter."""
        return "%s"

    def open_watcher(
        self,
        channels: Sequence[str],
        *,
        queues: Sequence[str] = (),
        listen_alias: str | None = None,
    ) -> Watcher:
        """Return a watcher for ``channels`` (already-mapped names) and the ``queues``' new jobs.

        ``listen_alias`` is the alias of a direct connection past any pooler,
        for an engine whose wake-ups need a session.
        """
        raise NotImplementedError

    # --- the statements each engine writes its own way -------------------------------

    def enqueue(self, stamps: EnqueueStamps, payloads: Sequence[str]) -> list[int]:
        """Insert one job per payload in one statement; return the ids in payload order.

        Joins the caller's transaction; workers listening on the queue are
        woken once it commits.
        """
        raise NotImplementedError

    def insert_unique(
        self, cursor: Any, stamps: EnqueueStamps, keyed: dict[str, str]
    ) -> dict[str, int]:
        """Insert a job per (unique key, payload) of ``keyed`` whose key no live job holds.

        Inside the caller's write transaction; a key held by a concurrent,
        uncommitted enqueue waits for it to end. Returns {key: new id} for
        the rows written; a key left out was taken.
        """
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

        One transaction (and on PostgreSQL one statement): the acks are
        durable once this returns, and the worker pays one commit per cycle.
        Before claiming, the queue's lapsed claims with no attempts left are
        dead-lettered and the others become claimable again. A claim adds 1
        to ``attempts`` and to ``generation``. Returns (acked ids, claimed
        jobs in claim order: priority descending, run_at, id). This is the
        one claim path; later claim rules (uniqueness, pauses, limits) extend
        each engine's version of it.
        """
        raise NotImplementedError

    def bury(self, where: str, params: list[Any], error: str) -> int:
        """Move the live rows matching ``where`` to the dead letters with ``error``.

        ``where`` may end with one ``{now}``, the database clock; ``params``
        fill the ``%s`` before it. Returns how many rows moved.
        """
        raise NotImplementedError

    def ack_many(self, queue: str, ids: Sequence[int]) -> int:
        """Delete each of ``ids`` in ``queue`` under an unexpired claim; return the count."""
        raise NotImplementedError

    def ack_fenced(self, worker_id: str, fences: Sequence[tuple[int, int]]) -> list[int]:
        """Delete each (id, generation) still under ``worker_id``'s claim; return the ids."""
        raise NotImplementedError

    def notify(self, channel: str, payload: str) -> None:
        """Send ``payload`` on ``channel``, delivered when the caller's transaction commits."""
        raise NotImplementedError

    def move_dead_to_live(self, cursor: Any, ids: Sequence[int]) -> dict[str, int]:
        """Requeue the dead letters ``ids`` inside the caller's write transaction.

        Returns how many moved per queue.
        """
        raise NotImplementedError

    def record_outcomes(self, rows: Sequence[tuple[str, int, int, int]]) -> None:
        """Add (queue, acked, retried, dead) to each queue's row of the current minute."""
        raise NotImplementedError

    def acquire_lock(self, name: str, owner: str, ttl_s: float) -> tuple[int, datetime] | None:
        """Take or renew the lease ``name`` for ``owner``; return (fence, expires_at) or None.

        None means another owner holds an unexpired lease. The lease is kept
        by its owner while unexpired; anyone may take it once it has expired
        (or been released, which expires it at once). Every take that is not
        the live owner renewing is a change of hands and bumps the fence.
        """
        raise NotImplementedError

    def renew_lock(self, name: str, owner: str, fence: int, ttl_s: float) -> datetime | None:
        """Reset an unexpired lease to now + ``ttl_s``; return the new expiry, or None if lost."""
        raise NotImplementedError

    def upsert_schedule(self, values: dict[str, Any], next_run_at: datetime) -> None:
        """Insert or update the schedule ``values["name"]`` in one statement.

        ``values`` holds name, spec, interval_s, zone, misfire, queue, payload
        (JSON text), the resolved stamps and ``declared``. An unchanged spec
        and zone keep the stored ``next_run_at`` and ``refused_from``; a changed
        one takes ``next_run_at`` and drops the refusal. ``enabled`` survives
        re-registration; ``admin_edited_at`` is cleared (settings or code win).
        """
        raise NotImplementedError

    # --- shared helpers ---------------------------------------------------------------

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

    def job_from_row(self, row: Sequence[Any], codec: Any = None) -> JobRecord:
        """Build a job from its row (``JOB_COLUMNS``); a claim passes the payload ``codec`` once.

        Reading ``PAYLOAD_CODEC`` goes through Django's settings (a microsecond
        or two): once per claimed batch, not once per job. The frozen record
        is filled in one step rather than through its ``__init__``, which sets
        each of its twenty fields through ``object.__setattr__``: that cost
        more than two microseconds a claimed job, a tenth of a no-op job's
        whole run.
        """
        dt = self.to_datetime
        job = _new_record(JobRecord)
        values = job.__dict__
        values.update(zip(JOB_COLUMNS, row, strict=True))
        values["payload"] = (codec or app_settings.payload_codec).decode(self.load_json(row[2]))
        for name in ("run_at", "expires_at", "claim_expires_at", "enqueued_at"):
            values[name] = dt(values[name])
        values["died_at"] = None
        return job

    def _rowcount(self, sql: str, params: Sequence[Any]) -> int:
        with self.connection.cursor() as cursor:
            cursor.execute(sql, list(params))
            return cursor.rowcount

    def _fetchall(self, sql: str, params: Sequence[Any]) -> list[Any]:
        with self.connection.cursor() as cursor:
            cursor.execute(sql, list(params))
            return cursor.fetchall()

    def _seconds_until(self, soonest: Any, db_now: Any) -> float | None:
        soonest, db_now = self.to_datetime(soonest), self.to_datetime(db_now)
        if soonest is None or db_now is None:
            return None
        return max((soonest - db_now).total_seconds(), 0.0)

    # --- unique jobs -----------------------------------------------------------------

    def enqueue_unique(
        self,
        stamps: EnqueueStamps,
        keyed: dict[str, str],
        unique_for_s: float | None,
    ) -> dict[str, tuple[int, bool]]:
        """Enqueue a job per (distinct unique key, payload) unless its key is taken.

        Returns {key: (id, created)}: the new job's id, or the id of the job
        holding the key. A key is held by the live job that has it (the
        ``alk_job_unique`` index decides, so concurrent enqueues of one key
        write one row) and, once that job has left, by its ``UniqueWindow``
        until ``held_until`` unless it was dead-lettered. The window is read
        after our own row is in: by then a holder that committed before us
        is visible, so no enqueue slips between a holder's ack and its
        window. With ``unique_for_s``, each new job's window is written too.
        One transaction, joining the caller's: a rollback frees the keys.
        """
        result: dict[str, tuple[int, bool]] = {}
        created: dict[str, int] = {}
        with self.write_transaction() as cursor:
            waiting = dict(keyed)
            while waiting:
                written = self.insert_unique(cursor, stamps, waiting)
                created.update(written)
                taken = [key for key in waiting if key not in written]
                holders = self._live_holders(cursor, stamps.queue, taken) if taken else {}
                for key, job_id in holders.items():
                    result[key] = (job_id, False)
                # A key neither written nor held: its holder left in between; try again.
                waiting = {
                    k: p for k, p in waiting.items() if k not in written and k not in holders
                }
            held = self._window_holders(cursor, stamps.queue, list(created)) if created else {}
            if held:
                ids, params = self.ids_sql([created.pop(key) for key in held])
                cursor.execute(f"DELETE FROM {JOB_TABLE} WHERE {ids}", params)
                result.update((key, (job_id, False)) for key, job_id in held.items())
            if created and unique_for_s is not None:
                self._write_windows(cursor, stamps.queue, created, unique_for_s)
            if created and self.supports_listen_notify:
                self.notify(stamps.channel, "")
        result.update((key, (job_id, True)) for key, job_id in created.items())
        return result

    @staticmethod
    def _key_marks(keys: Sequence[str]) -> str:
        return ", ".join(["%s"] * len(keys))

    #: Appended to the read of a taken key's holder; see ``MysqlDialect``.
    holder_read_lock: ClassVar[str] = ""

    def _live_holders(self, cursor: Any, queue: str, keys: Sequence[str]) -> dict[str, int]:
        """Return {key: id} of the live jobs of ``queue`` that hold ``keys``."""
        cursor.execute(
            f"SELECT unique_key, id FROM {JOB_TABLE} WHERE queue = %s "
            f"AND unique_key IN ({self._key_marks(keys)}){self.holder_read_lock}",
            [queue, *keys],
        )
        return {key: job_id for key, job_id in cursor.fetchall()}

    def _window_holders(self, cursor: Any, queue: str, keys: Sequence[str]) -> dict[str, int]:
        """Return {key: job id} of the unexpired windows on ``keys`` whose job is not dead."""
        now, now_params = self.now_sql()
        cursor.execute(
            f"SELECT w.unique_key, w.job_id FROM {WINDOW_TABLE} w WHERE w.queue = %s "
            f"AND w.unique_key IN ({self._key_marks(keys)}) AND w.held_until > {now} "
            f"AND NOT EXISTS (SELECT 1 FROM {DEAD_TABLE} d WHERE d.id = w.job_id)",
            [queue, *keys, *now_params],
        )
        return {key: job_id for key, job_id in cursor.fetchall()}

    def _write_windows(
        self, cursor: Any, queue: str, created: dict[str, int], unique_for_s: float
    ) -> None:
        """Hold each new job's key until its ``enqueued_at`` + ``unique_for_s``.

        A key's old window (expired, or of a dead job) is replaced.
        """
        keys = list(created)
        cursor.execute(
            f"DELETE FROM {WINDOW_TABLE} WHERE queue = %s "
            f"AND unique_key IN ({self._key_marks(keys)})",
            [queue, *keys],
        )
        ids, params = self.ids_sql(list(created.values()))
        cursor.execute(
            f"INSERT INTO {WINDOW_TABLE} (queue, unique_key, job_id, held_until) "
            f"SELECT queue, unique_key, id, {self.plus_sql('enqueued_at', '%s')} "
            f"FROM {JOB_TABLE} WHERE {ids}",
            [float(unique_for_s), *params],
        )

    # --- queue statements ---------------------------------------------------------------

    def claim(self, queue: str, worker_id: str, n: int) -> list[JobRecord]:
        """Claim up to ``n`` jobs: ``claim_and_ack`` with nothing to ack."""
        return self.claim_and_ack(queue, worker_id, n, "", ())[1]

    def ack(self, job_id: int, generation: int, worker_id: str) -> bool:
        """Delete the job if it is still under this claim."""
        now, now_params = self.now_sql()
        sql = f"DELETE FROM {JOB_TABLE} WHERE {FENCE.format(now=now)}"
        return self._rowcount(sql, [job_id, generation, worker_id, *now_params]) == 1

    def heartbeat(self, job_id: int, generation: int, worker_id: str, extend_s: float) -> bool:
        """Reset the claim deadline to now + ``extend_s`` if the claim is still live."""
        now, now_params = self.now_sql()
        sql = (
            f"UPDATE {JOB_TABLE} SET claim_expires_at = {self.plus_sql(now, '%s')} "
            f"WHERE {FENCE.format(now=now)}"
        )
        params = [*now_params, extend_s, job_id, generation, worker_id, *now_params]
        return self._rowcount(sql, params) == 1

    def requeue_claimed(
        self,
        job_id: int,
        generation: int,
        worker_id: str,
        *,
        delay_s: float | None,
        error: str | None,
        snooze: bool = False,
    ) -> bool:
        """Put a claimed row back to pending.

        With ``delay_s`` it is a retry: due after the delay, the claim's attempt
        kept. Without, it is a release: due where it was, the attempt given back.
        A snooze is due after ``delay_s`` with the attempt given back and one
        more snooze counted. No assignment reads a column another one writes,
        so the statement means the same on MySQL, which applies assignments
        left to right.
        """
        now, now_params = self.now_sql()
        sets = ["state = 'pending'", "worker_id = NULL", "claim_expires_at = NULL"]
        params: list[Any] = []
        if error is not None:
            sets.append("last_error = %s")
            params.append(error)
        if delay_s is None or snooze:
            sets.append("attempts = attempts - 1")
        if snooze:
            sets.append("snoozes = snoozes + 1")
        if delay_s is not None:
            sets.append(f"run_at = {self.plus_sql(now, '%s')}")
            params += [*now_params, delay_s]
        sql = f"UPDATE {JOB_TABLE} SET {', '.join(sets)} WHERE {FENCE.format(now=now)}"
        return self._rowcount(sql, [*params, job_id, generation, worker_id, *now_params]) == 1

    def bury_claimed(self, job_id: int, generation: int, worker_id: str, error: str) -> bool:
        """Dead-letter the job with ``error`` if it is still under this claim."""
        return self.bury(FENCE, [job_id, generation, worker_id], error) == 1

    def cancel(self, queue: str, job_id: int) -> bool:
        """Delete a live job of ``queue`` whatever its state, and free its unique key.

        A cancelled job did not succeed: its ``unique_for_s`` window goes too.
        """
        with self.write_transaction() as cursor:
            cursor.execute(f"DELETE FROM {JOB_TABLE} WHERE id = %s AND queue = %s", [job_id, queue])
            if cursor.rowcount != 1:
                return False
            cursor.execute(f"DELETE FROM {WINDOW_TABLE} WHERE job_id = %s", [job_id])
            return True

    def expire(self, queue: str) -> int:
        """Dead-letter the queue's live rows past their expiry; return how many."""
        return self.bury("queue = %s AND expires_at <= {now}", [queue], "expired")

    def purge_windows(self, queue: str) -> int:
        """Delete the queue's ``unique_for_s`` windows that have ended; return how many."""
        now, now_params = self.now_sql()
        sql = f"DELETE FROM {WINDOW_TABLE} WHERE queue = %s AND held_until <= {now}"
        return self._rowcount(sql, [queue, *now_params])

    def bury_exhausted_lapsed(self) -> int:
        """Dead-letter every lapsed claim with no attempts left, whatever its queue.

        A claim on a queue buries that queue's exhausted lapsed claims first;
        this catches those of a queue that nobody claims from any more.
        """
        return self.bury(EXHAUSTED_LAPSED, [], "max attempts exceeded")

    def purge_dead(self, queue: str, older_than_s: float) -> int:
        """Delete the queue's dead letters that died ``older_than_s`` ago or earlier."""
        now, now_params = self.now_sql()
        cutoff = self.plus_sql(now, "%s")
        sql = f"DELETE FROM {DEAD_TABLE} WHERE queue = %s AND died_at <= {cutoff}"
        return self._rowcount(sql, [queue, *now_params, -older_than_s])

    def stats(self, queue: str) -> tuple[int, int, int, int, int, float | None]:
        """Return pending (ready), scheduled, processing, overdue, dead, oldest ready age."""
        now, now_params = self.now_sql()
        live = f"FROM {JOB_TABLE} WHERE queue = %s AND state ="
        sql = (
            f"SELECT (SELECT count(*) {live} 'pending' AND run_at <= {now}), "
            f"(SELECT count(*) {live} 'pending' AND run_at > {now}), "
            f"(SELECT count(*) {live} 'processing'), "
            f"(SELECT count(*) {live} 'processing' AND claim_expires_at <= {now}), "
            f"(SELECT count(*) FROM {DEAD_TABLE} WHERE queue = %s), "
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
        row = self._fetchall(sql, params)[0]
        oldest, db_now = self.to_datetime(row[5]), self.to_datetime(row[6])
        age = (db_now - oldest).total_seconds() if oldest and db_now else None
        return int(row[0]), int(row[1]), int(row[2]), int(row[3]), int(row[4]), age

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
            f"SELECT (SELECT min(run_at) FROM {JOB_TABLE} WHERE queue IN ({marks}) "
            f"AND state = 'pending' AND run_at > enqueued_at AND run_at > {now}), "
            f"(SELECT min(claim_expires_at) FROM {JOB_TABLE} WHERE queue IN ({marks}) "
            f"AND state = 'processing' AND claim_expires_at > {now}), {now}"
        )
        row = self._fetchall(sql, [*queues, *now_params, *queues, *now_params, *now_params])[0]
        times = [t for t in (self.to_datetime(row[0]), self.to_datetime(row[1])) if t]
        return self._seconds_until(min(times), row[2]) if times else None

    def database_now(self) -> datetime:
        """Return the database's clock, timezone-aware."""
        now, now_params = self.now_sql()
        return self.to_datetime(self._fetchall(f"SELECT {now}", now_params)[0][0])  # type: ignore[return-value]

    # --- leases and schedules -----------------------------------------------------------

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

    def seconds_until_next_fire(self) -> float | None:
        """Return seconds until the soonest enabled schedule is due (0 if one is), or None."""
        now, now_params = self.now_sql()
        sql = f"SELECT min(next_run_at), {now} FROM {SCHEDULE_TABLE} WHERE enabled = %s"
        row = self._fetchall(sql, [*now_params, True])[0]
        return self._seconds_until(row[0], row[1])

    # --- queue controls (standard SQL in controls.ControlDialect) ---------------------------

    def retry_now(
        self, cursor: Any, ids: Sequence[int] | None, queue: str | None
    ) -> tuple[int, list[str]]:
        """Make jobs waiting for a retry due now, inside the caller's write transaction.

        Waiting for a retry: pending, attempted at least once, due later (a
        backoff, or a retry's or snooze's delay). ``ids`` and ``queue``
        narrow the selection (None: any). Returns how many rows changed and
        the queues they are in, to wake.
        """
        now, now_params = self.now_sql()
        where, params = f"state = 'pending' AND attempts > 0 AND run_at > {now}", [*now_params]
        if ids is not None:
            match, match_params = self.ids_sql(ids)
            where, params = f"{where} AND {match}", [*params, *match_params]
        if queue is not None:
            where, params = f"{where} AND queue = %s", [*params, queue]
        cursor.execute(f"SELECT DISTINCT queue FROM {JOB_TABLE} WHERE {where}", params)
        queues = sorted(row[0] for row in cursor.fetchall())
        if not queues:
            return 0, []
        cursor.execute(
            f"UPDATE {JOB_TABLE} SET run_at = {now} WHERE {where}", [*now_params, *params]
        )
        return cursor.rowcount, queues

    def set_paused(self, queue: str, paused: bool, channel: str) -> bool:
        """Pause or resume ``queue`` and notify ``channel``; False when it already was."""
        raise NotImplementedError

    def paused_queues(self) -> dict[str, datetime | None]:
        """Return every paused queue with the time it was paused."""
        raise NotImplementedError

    def claim_limited(
        self,
        queue: str,
        worker_id: str,
        n: int,
        ack_worker_id: str,
        fences: Sequence[tuple[int, int]],
        limits: QueueLimits,
    ) -> tuple[list[int], list[JobRecord], float | None]:
        """``claim_and_ack`` under ``max_running``/``rate``: (acked, jobs, hold_s)."""
        raise NotImplementedError

    # --- operators (standard SQL in operators.OperatorDialect) -----------------------------

    def dead_ids(self, queue: str, after_id: int, limit: int) -> list[int]:
        """Return up to ``limit`` ids of ``queue``'s dead letters above ``after_id``, ascending."""
        raise NotImplementedError

    def dead_queues(self) -> list[str]:
        """Return the queues that have dead letters, sorted."""
        raise NotImplementedError

    def delete_dead(self, ids: Sequence[int]) -> int:
        """Delete the dead letters ``ids``; return the count."""
        raise NotImplementedError

    def purge_dead_batch(self, queue: str, cutoff: datetime, limit: int) -> int:
        """Delete up to ``limit`` of ``queue``'s dead letters that died at or before ``cutoff``."""
        raise NotImplementedError

    def overview(self, now: datetime) -> dict[str, dict[str, Any]]:
        """Return per-queue counts (pending, scheduled, processing, overdue, dead) as of ``now``."""
        raise NotImplementedError

    def prune_outcomes(self, keep_s: float) -> int:
        """Delete outcome counters older than ``keep_s`` seconds; return the count."""
        raise NotImplementedError


def schedule_params(dialect: Dialect, values: dict[str, Any], next_run_at: datetime) -> list[Any]:
    """Return the schedule upsert's row values, in column order (name … next_run_at)."""
    return [
        values["name"], values["spec"], values["interval_s"], values["zone"],
        values["misfire"], values["queue"], values["payload"], values["priority"],
        values["max_attempts"], values["visibility_timeout_s"], values["retry_base_s"],
        values["expires_s"], True, values["declared"], dialect.adapt_datetime(next_run_at),
    ]  # fmt: skip


SCHEDULE_COLUMNS = (
    "name, spec, interval_s, zone, misfire, queue, payload, priority, max_attempts, "
    "visibility_timeout_s, retry_base_s, expires_s, enabled, declared, next_run_at"
)
