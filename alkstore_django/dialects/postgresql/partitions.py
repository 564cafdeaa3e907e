"""PostgreSQL: the dead letters in one partition per UTC day, whole days dropped past retention.

At 100 million jobs a day the dead letters and their attempt history, kept
seven days, are the largest tables by design. Deleting a day of them row by
row writes every deletion to the WAL and leaves the heap and its indexes to
vacuum; Oban's and pg-boss's guides partition such a table by time and drop
whole partitions instead: a catalog change, no dead tuples.

The layout (migration 0017): ``alkstore_django_deadjob`` is partitioned by RANGE
(``died_at``), one partition per UTC day named ``alkstore_django_deadjob_pYYYYMMDD``,
plus ``alkstore_django_deadjob_default`` for a row whose day has none. Its primary key
is ``(id, died_at)``, since a partitioned table's unique constraints must hold
its partition key; Django's model state keeps ``id`` alone (ids are the job
ids, unique anyway). The partitions are this module's: only names of that
shape are read as days.

Three things keep it bounded, each here:

- ``tend`` (the worker upkeep's ``tend_partitions``, one worker at a time):
  the partitions of today and the next ``DAYS_AHEAD`` days exist, and a day
  found in DEFAULT gets its partition with its rows moved in. PostgreSQL
  refuses to create a partition whose range has rows in DEFAULT, so the rows
  leave DEFAULT and the partition is attached in one transaction.
- ``drop_expired`` (the first step of ``purge_dead``): a day whose every
  queue's retention (``dead_letter_retention_s`` of ``ALKSTORE["QUEUES"]``)
  has passed since the day's end is dropped, after its jobs' attempt history
  and unique windows are deleted in batches. A day with a row of a queue that
  keeps dead letters longer, or for ever, stays.
- ``spared_s`` (the second step): the batched purge then deletes the rest,
  except the rows of the day that will be dropped whole next: a queue kept a
  day or longer loses its dead letters with their day, up to a day past their
  retention, rather than one by one.

Creating and dropping a partition take locks on the whole table (attaching:
DEFAULT's, exclusively; dropping: the table's, exclusively) for milliseconds;
each waits at most ``LOCK_TIMEOUT`` behind a long transaction, then gives up
until the next round rather than holding every new dead letter up in its queue.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import TYPE_CHECKING, Any

from django.db import OperationalError

from ...conf import app_settings
from ...models import Attempt
from ..base import DEAD_TABLE, WINDOW_TABLE
from ..operators import distinct_queues_sql

if TYPE_CHECKING:
    from .dialect import PostgresDialect

logger = logging.getLogger(__name__)

DAY = timedelta(days=1)
DAY_S = DAY.total_seconds()
# Tended every sweep, a day's partition exists this many days before it is needed.
DAYS_AHEAD = 3
DEFAULT_PARTITION = f"{DEAD_TABLE}_default"
DAY_PREFIX = f"{DEAD_TABLE}_p"
DAY_NAME = f"^{DAY_PREFIX}[0-9]{{8}}$"
PRIMARY_KEY = f"{DEAD_TABLE}_pkey"
# The old table while the migration copies it, in either direction.
SWAPPED = f"{DEAD_TABLE}_swapped"
# One worker tends or drops at a time: a lease, which (unlike a session's
# advisory lock) holds across the drop's transactions behind a pooler too.
LEASE = "__alkstore_dead_partitions"
LEASE_TTL_S = 300.0
# Dead letters per batch whose attempt history and windows are deleted.
BATCH = 5_000
LOCK_TIMEOUT = "2s"
SPARE_MARGIN_S = 1.0
LOCK_NOT_AVAILABLE = "55P03"
ATTEMPT_TABLE = Attempt._meta.db_table
COPY_LIKE = "INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE INCLUDING COMPRESSION"


@dataclass(frozen=True)
class DayPartition:
    """One UTC day's partition: rows with ``lo <= died_at < hi``."""

    day: date

    @property
    def name(self) -> str:
        return f"{DAY_PREFIX}{self.day:%Y%m%d}"

    @property
    def lo(self) -> datetime:
        return datetime.combine(self.day, time(), tzinfo=UTC)

    @property
    def hi(self) -> datetime:
        return self.lo + DAY


def _literal(at: datetime) -> str:
    """Return a timestamptz literal for DDL, which takes no parameters (our own instants only)."""
    return f"'{at.isoformat()}'::timestamptz"


def layout(cursor: Any) -> list[DayPartition] | None:
    """Return the day partitions, oldest first; None when the table is not partitioned."""
    cursor.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_partitioned_table WHERE partrelid = to_regclass(%s)), "
        "ARRAY(SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = to_regclass(%s) AND c.relname ~ %s ORDER BY c.relname)",
        [DEAD_TABLE, DEAD_TABLE, DAY_NAME],
    )
    partitioned, names = cursor.fetchone()
    if not partitioned:
        return None
    return [DayPartition(datetime.strptime(n[len(DAY_PREFIX) :], "%Y%m%d").date()) for n in names]


def days_in(cursor: Any, table: str) -> list[date]:
    """Return the UTC days ``table`` has rows of: one probe of its ``died_at`` index a day."""
    day = "date_trunc('day', {}, 'UTC')"
    cursor.execute(
        f"WITH RECURSIVE d(day) AS (SELECT {day.format('min(died_at)')} FROM {table} "
        f"UNION ALL SELECT (SELECT {day.format('min(died_at)')} FROM {table} "
        "WHERE died_at >= d.day + interval '1 day') FROM d WHERE d.day IS NOT NULL) "
        "SELECT (day AT TIME ZONE 'UTC')::date FROM d WHERE day IS NOT NULL",
        [],
    )
    return [row[0] for row in cursor.fetchall()]


def queues_in(cursor: Any, table: str) -> list[str]:
    """Return the queues with rows in ``table`` (a partition), sorted: a probe a queue."""
    cursor.execute(distinct_queues_sql(table), [])
    return [row[0] for row in cursor.fetchall()]


def storage_of(cursor: Any, table: str) -> str:
    """Return ``table``'s storage parameters as a ``WITH (…)`` clause, or "" when it has none.

    A partitioned table holds none itself (PostgreSQL refuses them), so the
    autovacuum settings of the table before it was partitioned live on each
    partition: DEFAULT keeps them and every new day copies DEFAULT's.
    """
    cursor.execute("SELECT reloptions FROM pg_class WHERE oid = to_regclass(%s)", [table])
    row = cursor.fetchone()
    options = row[0] if row else None
    return f" WITH ({', '.join(options)})" if options else ""


def attach_day(cursor: Any, part: DayPartition, storage: str) -> int:
    """Create ``part`` with the rows DEFAULT holds for its day; return how many moved.

    Inside the caller's transaction. The table is made beside the parent and
    attached (``ATTACH`` locks the parent less than ``CREATE … PARTITION OF``);
    the missing indexes are built on attach.
    """
    cursor.execute(f"CREATE TABLE {part.name} (LIKE {DEAD_TABLE} {COPY_LIKE}){storage}")
    lo, hi = _literal(part.lo), _literal(part.hi)
    cursor.execute(
        f"WITH moved AS (DELETE FROM {DEFAULT_PARTITION} WHERE died_at >= {lo} "
        f"AND died_at < {hi} RETURNING *) INSERT INTO {part.name} SELECT * FROM moved"
    )
    moved = cursor.rowcount
    cursor.execute(
        f"ALTER TABLE {DEAD_TABLE} ATTACH PARTITION {part.name} FOR VALUES FROM ({lo}) TO ({hi})"
    )
    return moved


def _limit_lock_waits(cursor: Any) -> None:
    # Local to the transaction (a savepoint inside a caller's keeps it to the
    # caller's end, which only our own callers in tests are).
    cursor.execute("SELECT set_config('lock_timeout', %s, true)", [LOCK_TIMEOUT])


def _gave_up_waiting(exc: OperationalError, doing: str) -> bool:
    """Log and return True when ``exc`` is our ``lock_timeout``; False for any other error."""
    if getattr(exc.__cause__, "sqlstate", None) != LOCK_NOT_AVAILABLE:
        return False
    logger.warning(
        "dead-letter partitions: %s waited past %s for a lock; next round", doing, LOCK_TIMEOUT
    )
    return True


class _Lease:
    """The partitions' lease for one tending or drop: ``held`` says whether it was had."""

    def __init__(self, dialect: PostgresDialect) -> None:
        self.dialect = dialect
        self.owner = f"dead-partitions:{secrets.token_hex(8)}"
        self.fence: int | None = None

    @property
    def held(self) -> bool:
        return self.fence is not None

    def __enter__(self) -> _Lease:
        taken = self.dialect.acquire_lock(LEASE, self.owner, LEASE_TTL_S)
        self.fence = None if taken is None else taken[0]
        return self

    def renew(self) -> None:
        if self.fence is not None:
            self.dialect.renew_lock(LEASE, self.owner, self.fence, LEASE_TTL_S)

    def __exit__(self, *exc_info: object) -> None:
        if self.fence is not None:
            self.dialect.release_lock(LEASE, self.owner, self.fence)


def _missing_days(dialect: PostgresDialect, cursor: Any) -> list[date]:
    """Return the days that should have a partition and have none: ahead, or found in DEFAULT."""
    parts = layout(cursor)
    if parts is None:
        return []
    today = dialect.database_now().astimezone(UTC).date()
    wanted = {today + i * DAY for i in range(DAYS_AHEAD + 1)}
    wanted.update(days_in(cursor, DEFAULT_PARTITION))
    return sorted(wanted - {p.day for p in parts})


def tend(dialect: PostgresDialect) -> int:
    """Create the partitions of today and the next days, and of the days found in DEFAULT.

    Reads only, on the common round where every day has its partition. Else
    one transaction, by one worker at a time (the others skip the round).
    Returns how many partitions were created; 0 on a table that is not
    partitioned, or when a lock was not had within ``LOCK_TIMEOUT``.
    """
    with dialect.connection.cursor() as cursor:
        if not _missing_days(dialect, cursor):
            return 0
    with _Lease(dialect) as lease:
        if not lease.held:
            return 0
        try:
            with dialect.atomic_write(), dialect.connection.cursor() as cursor:
                _limit_lock_waits(cursor)
                storage = storage_of(cursor, DEFAULT_PARTITION)
                missing = _missing_days(dialect, cursor)
                for day in missing:
                    moved = attach_day(cursor, DayPartition(day), storage)
                    logger.info("dead-letter partition created day=%s moved=%d", day, moved)
                return len(missing)
        except OperationalError as exc:
            if _gave_up_waiting(exc, "creating a partition"):
                return 0
            raise


def _retention_s(queue: str, own: str, own_s: float) -> float | None:
    """Return how long ``queue`` keeps its dead letters: ``own_s`` for ``own``, else settings."""
    return own_s if queue == own else app_settings.queue_defaults(queue).dead_letter_retention_s


def _all_past(queues: Sequence[str], end: datetime, now: datetime, own: str, own_s: float) -> bool:
    """Return whether every row of ``queues`` that died before ``end`` is past its retention."""
    kept = [_retention_s(q, own, own_s) for q in queues]
    return all(k is not None and end + timedelta(seconds=k) <= now for k in kept)


def drop_expired(dialect: PostgresDialect, queue: str, older_than_s: float) -> int:
    """Drop the past days holding ``queue``'s rows whose every row is past its retention.

    ``queue``'s rows are past ``older_than_s`` after they died (its handle's
    retention); every other queue's after its settings'. A day's attempt
    history and unique windows go first, in batches, then the day in one
    short transaction. Returns how many of ``queue``'s dead letters went.
    """
    with dialect.connection.cursor() as cursor:
        parts = layout(cursor) or []
        now = dialect.database_now()
        ended = [p for p in parts if p.hi + timedelta(seconds=older_than_s) <= now]
        if not ended:
            return 0
        # One probe of each ended day's (queue, died_at) index, in one round trip.
        probes = " UNION ALL ".join(
            f"SELECT %s WHERE EXISTS (SELECT 1 FROM {p.name} WHERE queue = %s)" for p in ended
        )
        cursor.execute(probes, [value for p in ended for value in (p.name, queue)])
        holding = {row[0] for row in cursor.fetchall()}
        droppable = [
            p
            for p in ended
            if p.name in holding
            and _all_past(queues_in(cursor, p.name), p.hi, now, queue, older_than_s)
        ]
    if not droppable:
        return 0
    dropped = 0
    with _Lease(dialect) as lease:
        for part in droppable if lease.held else ():
            _forget_history(dialect, part, lease)
            dropped += _drop_day(dialect, part, queue, older_than_s)
    return dropped


def _forget_history(dialect: PostgresDialect, part: DayPartition, lease: _Lease) -> None:
    """Delete the attempt history and the unique windows of ``part``'s dead letters, in batches.

    The dead letters are walked in id order along the partition's primary
    key, ``BATCH`` at a time, each batch one statement in its own transaction
    (never one long delete). A crash half way leaves the day to the next
    round, which starts again: what is gone stays gone.
    """
    sql = (
        f"WITH ids AS (SELECT id FROM {part.name} WHERE id > %s ORDER BY id LIMIT %s), "
        f"a AS (DELETE FROM {ATTEMPT_TABLE} WHERE job_id = ANY(ARRAY(SELECT id FROM ids))), "
        f"w AS (DELETE FROM {WINDOW_TABLE} WHERE job_id = ANY(ARRAY(SELECT id FROM ids))) "
        "SELECT max(id), count(*) FROM ids"
    )
    after = -(2**63)
    while True:
        with dialect.atomic_write(), dialect.connection.cursor() as cursor:
            cursor.execute(sql, [after, BATCH])
            last, count = cursor.fetchone()
        if count < BATCH:
            return
        after = last
        lease.renew()


def _drop_day(dialect: PostgresDialect, part: DayPartition, queue: str, older_than_s: float) -> int:
    """Drop ``part`` if it still holds only rows past retention; return ``queue``'s rows in it.

    The rows are counted first, unlocked (a past day gets no new dead letters).
    Then the table lock, which the drop needs anyway, comes before the check,
    so none can arrive between the check and the drop; it is held for the
    check (a probe per queue) and the drop only.
    """
    with dialect.connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {part.name} WHERE queue = %s", [queue])
        (count,) = cursor.fetchone()
    try:
        with dialect.atomic_write(), dialect.connection.cursor() as cursor:
            _limit_lock_waits(cursor)
            cursor.execute(f"LOCK TABLE {DEAD_TABLE} IN ACCESS EXCLUSIVE MODE")
            if part not in (layout(cursor) or ()):
                return 0
            now = dialect.database_now()
            if not _all_past(queues_in(cursor, part.name), part.hi, now, queue, older_than_s):
                return 0
            cursor.execute(f"DROP TABLE {part.name}")
    except OperationalError as exc:
        if _gave_up_waiting(exc, "dropping a partition"):
            return 0
        raise
    logger.info("dead-letter partition dropped day=%s dead_letters=%d", part.day, count)
    return int(count)


def spared_s(dialect: PostgresDialect, queue: str, older_than_s: float) -> float:
    """Return the age past which the batched purge deletes ``queue``'s dead letters.

    ``older_than_s``, unless the day its cutoff falls in will be dropped whole
    once ``queue``'s rows there are all past (every queue in it keeps its dead
    letters no longer than ``queue``): then that day's rows are left for the
    drop, and the age is the day's start. Only for a queue kept a day or
    more: a shorter retention is not stretched by a day.
    """
    if older_than_s < DAY_S:
        return older_than_s
    with dialect.connection.cursor() as cursor:
        parts = layout(cursor) or []
        now = dialect.database_now()
        cutoff = now - timedelta(seconds=older_than_s)
        day = next((p for p in parts if p.lo <= cutoff < p.hi), None)
        if day is None:
            return older_than_s
        queues = queues_in(cursor, day.name)
    kept = [_retention_s(q, queue, older_than_s) for q in queues]
    if queue in queues and all(k is not None and k <= older_than_s for k in kept):
        # The purge reads the clock again, a little later: the margin keeps
        # its cutoff before the day's first instant.
        return (now - day.lo).total_seconds() + SPARE_MARGIN_S
    return older_than_s


# --- the migration (0017): the table converted, with its rows, in one transaction ---


def _swap_in(cursor: Any, create: str, storage: str) -> None:
    """Rename the table aside and create its empty replacement (``create``: how it is laid out)."""
    cursor.execute(f"ALTER TABLE {DEAD_TABLE} RENAME TO {SWAPPED}")
    cursor.execute(f"CREATE TABLE {DEAD_TABLE} (LIKE {SWAPPED} {COPY_LIKE}){create}{storage}")


def _swap_out(cursor: Any, schema_editor: Any, model: Any, key: str) -> None:
    """Copy the rows over, drop the old table, then key and index the new one as the model says."""
    cursor.execute(f"INSERT INTO {DEAD_TABLE} SELECT * FROM {SWAPPED}")
    cursor.execute(f"DROP TABLE {SWAPPED}")
    # After the copy: an index built over the rows is cheaper than one kept up row by row.
    cursor.execute(f"ALTER TABLE {DEAD_TABLE} ADD CONSTRAINT {PRIMARY_KEY} PRIMARY KEY ({key})")
    for index in model._meta.indexes:
        schema_editor.add_index(model, index)


def partition_dead_letters(apps: Any, schema_editor: Any) -> None:
    """Forward: partition the dead letters by day, their rows kept (PostgreSQL only).

    Partitions cover every day the rows died on, and today and the next
    ``DAYS_AHEAD`` days; DEFAULT and each day keep the table's storage
    parameters (its autovacuum settings).
    """
    if schema_editor.connection.vendor != "postgresql":
        return
    model = apps.get_model("alkstore_django", "DeadJob")
    with schema_editor.connection.cursor() as cursor:
        storage = storage_of(cursor, DEAD_TABLE)
        days = set(days_in(cursor, DEAD_TABLE))
        cursor.execute("SELECT (statement_timestamp() AT TIME ZONE 'UTC')::date")
        (today,) = cursor.fetchone()
        days.update(today + i * DAY for i in range(DAYS_AHEAD + 1))
        _swap_in(cursor, " PARTITION BY RANGE (died_at)", "")
        cursor.execute(
            f"CREATE TABLE {DEFAULT_PARTITION} PARTITION OF {DEAD_TABLE} DEFAULT{storage}"
        )
        for day in sorted(days):
            attach_day(cursor, DayPartition(day), storage)
        _swap_out(cursor, schema_editor, model, "id, died_at")


def unpartition_dead_letters(apps: Any, schema_editor: Any) -> None:
    """Reverse: make the dead letters one plain table again, their rows kept (PostgreSQL only)."""
    if schema_editor.connection.vendor != "postgresql":
        return
    model = apps.get_model("alkstore_django", "DeadJob")
    with schema_editor.connection.cursor() as cursor:
        storage = storage_of(cursor, DEFAULT_PARTITION)
        _swap_in(cursor, "", storage)
        _swap_out(cursor, schema_editor, model, "id")
