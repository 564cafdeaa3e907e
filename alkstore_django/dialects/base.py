"""The vendor contract: the ``Dialect`` interface, the ``Watcher`` interface, shared SQL names.

``Dialect`` is the one interface between the services and a database engine,
the way Django's ``BaseDatabaseOperations`` is for the ORM. It holds the
capability flags, the hooks an engine supplies (its clock, its interval
arithmetic, its id lists, its transactions, its watcher) and, as abstract
methods, the statements each engine writes its own way. The statements all
engines speak alike are named groups beside this module (``claims``,
``unique``, ``controls``, ``operators``, ``leases``, ``schedules``,
``upserts``); an engine lists the groups it takes on its class line and
overrides what its SQL cannot share.

Every statement compares against the database's clock, never the app
server's, so a host with a wrong clock can neither claim early nor steal a
live claim. Placeholders are ``%s`` throughout (Django's SQLite cursor converts
them), so a literal percent sign is written ``%%``.
"""

from __future__ import annotations

import select
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from typing import Any, ClassVar, TypeVar

from django.core import checks
from django.db import connections, transaction

from ..codecs import load_json
from ..conf import app_settings
from ..models import (
    Attempt,
    ChannelMessage,
    DeadJob,
    Job,
    JobResult,
    LiveWorker,
    Lock,
    OutcomeMinute,
    Schedule,
    ScheduleFire,
    TaskResult,
    UniqueWindow,
)
from ..records import UNKEYED, EnqueueStamps, split_tags
from ..records import Job as JobRecord
from .batches import BatchedDeletes

JOB_TABLE = Job._meta.db_table
DEAD_TABLE = DeadJob._meta.db_table
LOCK_TABLE = Lock._meta.db_table
SCHEDULE_TABLE = Schedule._meta.db_table
FIRE_TABLE = ScheduleFire._meta.db_table
OUTCOME_TABLE = OutcomeMinute._meta.db_table
WINDOW_TABLE = UniqueWindow._meta.db_table
ATTEMPT_TABLE = Attempt._meta.db_table
RESULT_TABLE = JobResult._meta.db_table
WORKER_TABLE = LiveWorker._meta.db_table
TASK_RESULT_TABLE = TaskResult._meta.db_table
# Where ``notify`` writes on the engines without LISTEN/NOTIFY (SQLite, MariaDB/MySQL).
MESSAGE_TABLE = ChannelMessage._meta.db_table

T = TypeVar("T")

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
    "workflow_id",
    "step",
    "keep_result_s",
    "concurrency_key",
    "tags",
    "cancel_requested_at",
    "trace_context",
)
JOB_SELECT = ", ".join(JOB_COLUMNS)
_new_record = object.__new__
# A record's keys for a row of JOB_COLUMNS: the payload column's text is kept as
# ``stored_payload`` (what a process-pool child decodes itself), beside the payload.
_RECORD_KEYS = tuple("stored_payload" if name == "payload" else name for name in JOB_COLUMNS)
# The stamps a claimed record reads from its row (``Dialect.to_datetime``).
_RECORD_STAMPS = ("run_at", "expires_at", "claim_expires_at", "enqueued_at", "cancel_requested_at")
# The columns a dead letter copies from its live row (state and the claim
# deadline stay behind; last_error and died_at are written by the move).
DEAD_COPY = (
    "id, queue, payload, priority, run_at, attempts, max_attempts, "
    "visibility_timeout_s, retry_base_s, expires_at, worker_id, enqueued_at, generation, "
    "timeout_s, snoozes, max_snoozes, unique_key, workflow_id, step, keep_result_s, "
    "concurrency_key, tags, trace_context"
)
DEAD_COLUMNS = DEAD_COPY + ", last_error, died_at"
# What a dead letter becomes when it is requeued: the same id and stamps,
# pending, due now, attempts reset, its last error kept for the operator.
# An expiry that has already passed is dropped: a requeued job is meant to run.
# So is its unique key: another live job may hold it by now, and an operator's
# requeue must not fail on it. Its trace context is kept: its runs join the
# trace of the enqueue that made it.
REQUEUE_COLUMNS = JOB_SELECT
REQUEUE_SELECT = (
    "id, queue, payload, priority, {now}, 0, max_attempts, visibility_timeout_s, "
    "retry_base_s, CASE WHEN expires_at > {now} THEN expires_at END, 'pending', NULL, NULL, "
    "last_error, enqueued_at, generation, timeout_s, snoozes, max_snoozes, NULL, "
    "workflow_id, step, keep_result_s, concurrency_key, tags, NULL, trace_context"
)
# What every engine's enqueue writes: the columns, then the stamps' placeholders
# (``EnqueueStamps.stamp_params`` fills them, in this order).
ENQUEUE_COLUMNS = (
    "queue, payload, priority, run_at, attempts, max_attempts, visibility_timeout_s, "
    "retry_base_s, timeout_s, max_snoozes, trace_context, expires_at, state, enqueued_at"
)
STAMP_MARKS = "%s, %s, %s, %s, %s, %s"
SCHEDULE_COLUMNS = (
    "name, spec, interval_s, zone, misfire, queue, payload, priority, max_attempts, "
    "visibility_timeout_s, retry_base_s, expires_s, enabled, declared, next_run_at"
)


def marks(count: int) -> str:
    """Return ``count`` comma-separated placeholders."""
    return ", ".join(["%s"] * count)


class Watcher(ABC):
    """Waits for wake-ups on a set of channels over its own dedicated connection.

    ``interrupt_fd``, when set, is a socket whose becoming readable ends a
    wait at once (a SQLite or MariaDB/MySQL worker stopping: its watcher
    thread is joined without waiting out the rest of a wait).
    """

    interrupt_fd: int | None = None
    # Made once (a polling watcher pauses every few ms); it holds no descriptor to close.
    _poller: Any = None

    def pause(self, seconds: float) -> bool:
        """Sleep up to ``seconds`` between polls; False when ``interrupt_fd`` ended it early."""
        if self.interrupt_fd is None:
            time.sleep(seconds)
            return True
        if not hasattr(select, "poll"):  # Windows, whose select() takes a socket
            return not select.select([self.interrupt_fd], [], [], seconds)[0]
        if self._poller is None:
            self._poller = select.poll()
            self._poller.register(self.interrupt_fd, select.POLLIN)
        return not self._poller.poll(seconds * 1000)

    @abstractmethod
    def receive(self, timeout_s: float) -> list[tuple[str, str]]:
        """Return the (channel, payload) pairs that arrived within ``timeout_s``."""

    def fileno(self) -> int | None:
        """The socket that becomes readable when something arrives; None where there is none."""
        return None

    def wait(self, timeout_s: float) -> bool:
        """Return True as soon as something may have changed, False on timeout."""
        return bool(self.receive(timeout_s))

    def wait_for_payloads(self, timeout_s: float) -> tuple[bool, list[str]]:
        """Wait as ``wait``; return (woken, the payloads of the notifications that arrived).

        An engine whose worker watcher carries no payloads (SQLite watches
        the file) returns none: the worker's poll reads what they would say.
        """
        return self.wait(timeout_s), []

    @abstractmethod
    def close(self) -> None:
        """Close the watcher's connection."""


class Dialect(BatchedDeletes, ABC):
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
    #: The dead letters live in one partition per day, dropped whole once past
    #: retention (``tend_partitions``, ``purge_dead``). Without it they are one
    #: table, purged by batched deletes.
    supports_dead_letter_partitions: ClassVar[bool] = False

    def __init__(self, using: str) -> None:
        self.using = using

    def __repr__(self) -> str:
        return f"<{type(self).__name__} using={self.using!r}>"

    # --- engine hooks with a default -------------------------------------------------
    # Deliberately not abstract: an engine overrides only the ones it needs.

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

    @classmethod
    def tune_storage(cls, schema_editor: Any) -> None:
        """Set the engine's per-table storage settings (autovacuum); default: nothing."""

    @classmethod
    def untune_storage(cls, schema_editor: Any) -> None:
        """Undo ``tune_storage``; default: nothing."""

    def tend_partitions(self) -> int:
        """Create the dead letters' partitions of the coming days; return how many were made.

        Default: none, on an engine whose dead letters are one plain table.
        PostgreSQL keeps them in a partition per day, dropped whole past
        retention (``postgresql/partitions.py``).
        """
        return 0

    def server_problem(self) -> str | None:
        """Return why this database server cannot run alkstore (its version), or None."""
        return None

    def json_sql(self) -> str:
        """Return the placeholder for one JSON-text parameter."""
        return "%s"

    def to_datetime(self, value: Any) -> datetime | None:
        """Return a column's or a computed value's datetime, timezone-aware (None stays None)."""
        return value

    @contextmanager
    def write_transaction(self) -> Iterator[Any]:
        """Yield a cursor inside a write transaction (joining the caller's, if any).

        Default: Django's ``atomic()``, whose row locks are the engine's.
        """
        with self.atomic_write(), self.connection.cursor() as cursor:
            yield cursor

    def run_again_on_lock_race(self, attempt: Callable[[], T]) -> T:
        """Call ``attempt()``, a whole transaction of ours; run it again where the engine says so.

        Default: once. An engine that rolls a transaction back whole when it
        loses a lock race (InnoDB's deadlocks) runs it again, outside the
        caller's ``atomic()`` block only.
        """
        return attempt()

    def atomic_write(self) -> AbstractContextManager[Any]:
        """Return Django's ``atomic()`` for a transaction that will write, ORM calls and all.

        Default: ``atomic()`` itself. SQLite takes its write lock up front there.
        """
        return transaction.atomic(using=self.using)

    # --- engine hooks each engine supplies -------------------------------------------

    @abstractmethod
    def now_sql(self) -> tuple[str, list[Any]]:
        """Return SQL (and params) for the database's clock in this statement."""

    @abstractmethod
    def plus_sql(self, base: str, seconds: str) -> str:
        """Return SQL for the instant ``seconds`` (an SQL expression) after ``base``."""

    @abstractmethod
    def ids_sql(self, ids: Sequence[int]) -> tuple[str, list[Any]]:
        """Return SQL (and params) matching ``id`` against ``ids``."""

    @abstractmethod
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

    # --- the statements each engine writes its own way -------------------------------

    @abstractmethod
    def enqueue(self, stamps: EnqueueStamps, payloads: Sequence[str]) -> list[int]:
        """Insert one job per payload in one statement; return the ids in payload order.

        Joins the caller's transaction; workers listening on the queue are
        woken once it commits.
        """

    @abstractmethod
    def insert_unique(
        self, cursor: Any, stamps: EnqueueStamps, keyed: dict[str, str]
    ) -> dict[str, int]:
        """Insert a job per (unique key, payload) of ``keyed`` whose key no live job holds.

        Inside the caller's write transaction; a key held by a concurrent,
        uncommitted enqueue waits for it to end. Returns {key: new id} for
        the rows written; a key left out was taken.
        """

    @abstractmethod
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
        The queue's lapsed claims with attempts left are claimable like
        pending jobs; those not claimed go back to pending and those with no
        attempts left to the dead letters, in the same transaction (SQLite,
        MariaDB/MySQL) or, on PostgreSQL, in a statement of their own right
        after a claim that saw one. A claim adds 1
        to ``attempts`` and to ``generation``. Returns (acked ids, claimed
        jobs in claim order: priority descending, run_at, id). This is the
        one claim path; later claim rules (uniqueness, pauses, limits) extend
        each engine's version of it.
        """

    @abstractmethod
    def bury(self, where: str, params: list[Any], error: str) -> int:
        """Move the live rows matching ``where`` to the dead letters with ``error``.

        ``where`` may end with one ``{now}``, the database clock; ``params``
        fill the ``%s`` before it. Returns how many rows moved.
        """

    @abstractmethod
    def ack_many(self, queue: str, ids: Sequence[int]) -> int:
        """Delete each of ``ids`` in ``queue`` under an unexpired claim; return the count."""

    @abstractmethod
    def ack_fenced(self, worker_id: str, fences: Sequence[tuple[int, int]]) -> list[int]:
        """Delete each (id, generation) still under ``worker_id``'s claim; return the ids."""

    @abstractmethod
    def notify(self, channel: str, payload: str) -> None:
        """Send ``payload`` on ``channel``, delivered when the caller's transaction commits."""

    def wake_for(self, queue: str, channel: str) -> None:
        """Wake ``queue``'s waiting workers for a job made claimable without an enqueue.

        A release, a retry or a snooze. Nothing to send here: the SQLite and
        MariaDB/MySQL watchers see the job table change on their own.
        """

    def own_session(self, owned: bool = True) -> None:
        """Say whether this thread's connection carries a worker's own statements only.

        PostgreSQL then sets the session up for the claim; nothing to do here.
        """

    @abstractmethod
    def move_dead_to_live(self, cursor: Any, ids: Sequence[int]) -> dict[str, int]:
        """Requeue the dead letters ``ids`` inside the caller's write transaction.

        Returns how many moved per queue.
        """

    @abstractmethod
    def record_outcomes(self, rows: Sequence[tuple[str, int, int, int]]) -> None:
        """Add (queue, acked, retried, dead) to each queue's row of the current minute."""

    @abstractmethod
    def acquire_lock(self, name: str, owner: str, ttl_s: float) -> tuple[int, datetime] | None:
        """Take or renew the lease ``name`` for ``owner``; return (fence, expires_at) or None.

        None means another owner holds an unexpired lease. The lease is kept
        by its owner while unexpired; anyone may take it once it has expired
        (or been released, which expires it at once). Every take that is not
        the live owner renewing is a change of hands and bumps the fence.
        """

    @abstractmethod
    def renew_lock(self, name: str, owner: str, fence: int, ttl_s: float) -> datetime | None:
        """Reset an unexpired lease to now + ``ttl_s``; return the new expiry, or None if lost."""

    @abstractmethod
    def upsert_schedule(self, values: dict[str, Any], next_run_at: datetime) -> None:
        """Insert or update the schedule ``values["name"]`` in one statement.

        ``values`` holds name, spec, interval_s, zone, misfire, queue, payload
        (JSON text), the resolved stamps and ``declared``. An unchanged spec
        and zone keep the stored ``next_run_at`` and ``refused_from``; a changed
        one takes ``next_run_at`` and drops the refusal. ``enabled`` survives
        re-registration; ``admin_edited_at`` is cleared (settings or code win).
        """

    # --- shared helpers ---------------------------------------------------------------

    @property
    def connection(self) -> Any:
        return connections[self.using]

    def adapt_datetime(self, value: datetime) -> Any:
        return self.connection.ops.adapt_datetimefield_value(value)

    def job_from_row(self, row: Sequence[Any], codec: Any = None) -> JobRecord:
        """Build a job from its row (``JOB_COLUMNS``); a claim passes the payload ``codec`` once.

        Reading ``PAYLOAD_CODEC`` goes through Django's settings (a microsecond
        or two): once per claimed batch, not once per job. The frozen record
        is filled in one step rather than through its ``__init__``, which sets
        each of its twenty fields through ``object.__setattr__``: that cost
        more than two microseconds a claimed job, a tenth of a no-op job's
        whole run.
        """
        job = _new_record(JobRecord)
        values = job.__dict__
        values.update(zip(_RECORD_KEYS, row, strict=True))
        values["payload"] = (codec or app_settings.payload_codec).decode(load_json(row[2]))
        if type(self).to_datetime is not Dialect.to_datetime:
            # PostgreSQL's driver reads them timezone-aware: no call per stamp there.
            dt = self.to_datetime
            for name in _RECORD_STAMPS:
                if values[name] is not None:
                    values[name] = dt(values[name])
        values["died_at"] = None
        values["progress"] = None
        values["tags"] = split_tags(values["tags"])
        if values["concurrency_key"] == UNKEYED:
            values["concurrency_key"] = None
        return job

    def database_now(self) -> datetime:
        """Return the database's clock, timezone-aware."""
        now, now_params = self.now_sql()
        return self.to_datetime(self._fetchall(f"SELECT {now}", now_params)[0][0])  # type: ignore[return-value]

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
