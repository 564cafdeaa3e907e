"""Operators' services: repair dead letters, cancel jobs, pause schedules, read the overview.

The admin and ``manage.py alkstore`` only call these. Every change is a set of
single statements over many rows (never a per-row loop), and every timestamp
is the database's clock.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from . import results
from .conf import app_settings
from .errors import InvalidArgument
from .records import Job
from .scheduler.registry import list_schedules as list_schedules
from .scheduler.registry import set_schedules_enabled as set_schedules_enabled
from .store import Store
from .timing import UNIT_SECONDS
from .validation import (
    validate_duration,
    validate_int,
    validate_name,
    validate_tag,
)
from .workflows.progress import cancelling, resume

if TYPE_CHECKING:
    from django.db.models import QuerySet

    from .dialects import AnyDialect

logger = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 5_000
MAX_BATCH_SIZE = 50_000
DEFAULT_LIST_LIMIT = 50
MAX_LIST_LIMIT = 10_000
_AGE_RE = re.compile(r"([1-9][0-9]{0,9})([smhd])")

Progress = Callable[[int], None]
T = TypeVar("T")


def _alias(using: str | None) -> str:
    return using or app_settings.database


def _dialect(using: str | None) -> AnyDialect:
    """Return the alias's shared dialect: the one its ``Store`` uses."""
    from .dialects import dialect_for

    return dialect_for(_alias(using))


def _chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _ids(ids: Iterable[int]) -> list[int]:
    return sorted({validate_int("job id", i, minimum=-(2**63), maximum=2**63 - 1) for i in ids})


def _batch(batch_size: int) -> int:
    return validate_int("batch_size", batch_size, minimum=1, maximum=MAX_BATCH_SIZE)


def with_tag(rows: QuerySet[Any], tag: str | None) -> QuerySet[Any]:
    """Return ``rows`` with ``tag`` (None: all): lowercase tags stored ``",a,b,"``, one LIKE."""
    return rows if tag is None else rows.filter(tags__contains=f",{validate_tag(tag)},")


def parse_age(text: str) -> int:
    """Return the seconds in an age such as ``30s``, ``15m``, ``12h`` or ``7d``.

    Raises ``InvalidArgument`` naming the text for anything else.
    """
    match = _AGE_RE.fullmatch(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise InvalidArgument(
            f"Invalid age {text!r}: expected a positive whole number followed by s, m, h or d "
            "(for example 30s, 15m, 12h or 7d)."
        )
    return int(match.group(1)) * UNIT_SECONDS[match.group(2)]


# --- dead letters --------------------------------------------------------------


def requeue_dead(
    ids: Iterable[int] | None = None,
    *,
    queue: str | None = None,
    using: str | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: Progress | None = None,
    tag: str | None = None,
) -> int:
    """Move dead letters back to their queues as pending jobs; return how many moved.

    ``ids`` selects dead letters by id (restricted to ``queue`` when it is also
    given); ``queue`` alone selects every dead letter of that queue. ``tag``
    narrows either to the dead letters with that tag, or alone selects every
    dead letter with it, whatever its queue. Each job keeps its id, stamps,
    tags and ``last_error``; it becomes pending, due now by the database
    clock, with ``attempts`` reset to 0 (an expiry that has already passed is
    dropped so it can run). The whole requeue is one transaction,
    moved ``batch_size`` rows per statement; ``progress`` is called with the
    running count after each statement. Workers on the queues are woken on commit.
    """
    from .models import DeadJob
    from .queues import channel_for

    if ids is None and queue is None and tag is None:
        raise InvalidArgument(
            "Nothing to requeue: expected dead letter ids, a queue, a tag, or some of them."
        )
    if queue is not None:
        validate_name("queue", queue, allow_reserved=True)
    batch_size = _batch(batch_size)
    alias = _alias(using)
    sql = _dialect(alias)
    selected = None if ids is None else _ids(ids)
    if tag is not None:
        # Resolved to ids once: the id path below moves them in batches.
        rows = with_tag(DeadJob.objects.using(alias), tag)
        selected = _present(selected, rows if queue is None else rows.filter(queue=queue))
    total = 0
    woken: set[str] = set()
    # An ORM-joinable write transaction: the resume of workflow steps opens atomic blocks.
    with sql.atomic_write(), sql.connection.cursor() as cursor:
        if selected is None:
            assert queue is not None
            after_id = -(2**63)
            while batch := sql.dead_ids(queue, after_id, batch_size):
                total += _move(sql, cursor, batch, woken, progress, total)
                after_id = batch[-1]
        else:
            for chunk in _chunks(selected, batch_size):
                if queue is not None and tag is None:
                    rows = DeadJob.objects.using(alias).filter(queue=queue, id__in=chunk)
                    chunk = list(rows.values_list("id", flat=True))
                if chunk:
                    total += _move(sql, cursor, chunk, woken, progress, total)
        # Sent inside the transaction, the wake-ups are delivered only on commit.
        for name in sorted(woken):
            sql.notify(channel_for(name), "")
    return total


def _move(
    sql: AnyDialect,
    cursor: Any,
    ids: Sequence[int],
    woken: set[str],
    progress: Progress | None,
    done: int,
) -> int:
    from .models import TaskResult, TaskStatus

    # A requeued job runs without its key: its window must not hold it either.
    sql.release_dead_windows(ids)
    moved = sql.move_dead_to_live(cursor, ids)
    # Live again: a kept result is unknown until it ends anew, and a failed
    # workflow step (with the steps its failure cancelled) waits again.
    results.forget(sql.using, list(ids))
    resume(Store(sql.using), ids)
    # A Django Tasks job's result reads READY again, as get_result says of the
    # live job; its errors stay (the runner numbers this run's after them).
    TaskResult.objects.using(sql.using).filter(id__in=ids, status=TaskStatus.FAILED).update(
        status=TaskStatus.READY, finished_at=None, return_value=None
    )
    woken.update(moved)
    count = sum(moved.values())
    if progress is not None:
        progress(done + count)
    return count


def list_dead(
    *, queue: str | None = None, limit: int = DEFAULT_LIST_LIMIT, using: str | None = None
) -> list[Job]:
    """Return the newest dead letters (of ``queue`` when given), newest first, at most ``limit``."""
    from .models import DeadJob

    limit = validate_int("limit", limit, minimum=1, maximum=MAX_LIST_LIMIT)
    rows = DeadJob.objects.using(_alias(using)).order_by("-died_at", "-id")
    if queue is not None:
        validate_name("queue", queue, allow_reserved=True)
        rows = rows.filter(queue=queue)
    return [row.to_record() for row in rows[:limit]]


def get_dead(job_id: int, *, using: str | None = None) -> Job | None:
    """Return the dead letter ``job_id``, or None when there is none (a live job is not one)."""
    from .models import DeadJob

    (job_id,) = _ids([job_id])
    row = DeadJob.objects.using(_alias(using)).filter(id=job_id).first()
    return None if row is None else row.to_record()


def count_dead(
    queue: str | None = None, *, using: str | None = None, tag: str | None = None
) -> int:
    """Return how many dead letters ``requeue_dead(queue=queue, tag=tag)`` would move.

    Both None counts every dead letter.
    """
    from .models import DeadJob

    rows = with_tag(DeadJob.objects.using(_alias(using)), tag)
    if queue is not None:
        validate_name("queue", queue, allow_reserved=True)
        rows = rows.filter(queue=queue)
    return rows.count()


def missing_dead(
    ids: Iterable[int], *, queue: str | None = None, using: str | None = None
) -> list[int]:
    """Return those of ``ids`` that are not dead letters (of ``queue`` when given), sorted."""
    from .models import DeadJob

    rows = DeadJob.objects.using(_alias(using))
    if queue is not None:
        validate_name("queue", queue, allow_reserved=True)
        rows = rows.filter(queue=queue)
    return _absent(ids, rows)


def _absent(ids: Iterable[int], rows: QuerySet[Any]) -> list[int]:
    """Return those of ``ids`` (validated) that are not among ``rows``, sorted."""
    wanted = _ids(ids)
    found = set(_present(wanted, rows))
    return [i for i in wanted if i not in found]


def _present(ids: Sequence[int] | None, rows: QuerySet[Any]) -> list[int]:
    """Return those of ``ids`` (validated) among ``rows``, or all of theirs when None, sorted."""
    if ids is None:
        return list(rows.order_by("id").values_list("id", flat=True))
    found: list[int] = []
    for chunk in _chunks(ids, DEFAULT_BATCH_SIZE):
        found.extend(rows.filter(id__in=chunk).values_list("id", flat=True))
    return sorted(found)


def dead_letter_queues(*, using: str | None = None) -> list[str]:
    """Return the names of the queues that have dead letters, sorted (an index probe each)."""
    return _dialect(using).dead_queues()


def delete_dead(ids: Iterable[int], *, using: str | None = None) -> int:
    """Delete the dead letters ``ids`` in one transaction; return how many were deleted."""
    sql = _dialect(using)
    total = 0
    with sql.write_transaction():
        for chunk in _chunks(_ids(ids), MAX_BATCH_SIZE):
            total += sql.delete_dead(chunk)
    return total


def purge_dead(
    queue: str,
    older_than_s: float,
    *,
    using: str | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: Progress | None = None,
) -> int:
    """Delete ``queue``'s dead letters that died ``older_than_s`` seconds ago or earlier.

    The cutoff is fixed once from the database clock. Rows go ``batch_size`` at
    a time, oldest first, each batch its own short transaction so a long purge
    never holds the write lock; ``progress`` gets the running count. Returns
    the number deleted.
    """
    validate_name("queue", queue, allow_reserved=True)
    older_than_s = validate_duration("older_than_s", older_than_s)  # type: ignore[assignment]
    batch_size = _batch(batch_size)
    sql = _dialect(using)
    cutoff = sql.database_now() - timedelta(seconds=older_than_s)
    total = 0
    while True:
        with sql.write_transaction():
            deleted = sql.purge_dead_batch(queue, cutoff, batch_size)
        total += deleted
        if deleted and progress is not None:
            progress(total)
        if deleted < batch_size:
            return total


# --- live jobs ------------------------------------------------------------------


def cancel_jobs(ids: Iterable[int], *, using: str | None = None) -> int:
    """Delete the live jobs ``ids`` whatever their state; return how many were deleted.

    A running handler is not interrupted: its later ack simply finds nothing.
    Their unique keys are freed, ``unique_for_s`` windows included. A
    workflow step's job cancels its step; a kept result reads ``cancelled``.
    """
    from .models import Job, UniqueWindow

    alias = _alias(using)
    store = Store(alias)
    total = 0
    with store.dialect.atomic_write():
        for chunk in _chunks(_ids(ids), DEFAULT_BATCH_SIZE):
            with cancelling(store, chunk):
                deleted, _ = Job.objects.using(alias).filter(id__in=chunk).delete()
                UniqueWindow.objects.using(alias).filter(job_id__in=chunk).delete()
            total += deleted
    return total


def retry_now(
    ids: Iterable[int] | None = None,
    *,
    queue: str | None = None,
    using: str | None = None,
    tag: str | None = None,
) -> int:
    """Make live jobs waiting for a retry due now; return how many.

    Waiting for a retry means pending, attempted at least once and due later
    (its backoff, or the delay its handler asked for). ``ids`` selects jobs
    by id (restricted to ``queue`` when it is also given); ``queue`` alone
    selects every waiting job of that queue. ``tag`` narrows either to the
    jobs with that tag, or alone selects every waiting job with it, whatever
    its queue. Nothing else changes: the attempts already spent stay spent.
    One transaction; workers on the queues are woken on commit.
    """
    from .queues import channel_for

    if ids is None and queue is None and tag is None:
        raise InvalidArgument(
            "Nothing to retry: expected job ids, a queue, a tag, or some of them."
        )
    if queue is not None:
        validate_name("queue", queue, allow_reserved=True)
    selected = None if ids is None else _ids(ids)
    sql = _dialect(using)
    if tag is not None:
        # Resolved to the waiting jobs' ids; the update checks each is still waiting.
        selected = _present(selected, _waiting(using, queue, tag))
    total = 0
    with sql.write_transaction() as cursor:
        chunks = (None,) if selected is None else _chunks(selected, MAX_BATCH_SIZE)
        for chunk in chunks:
            changed, queues = sql.retry_now(cursor, chunk, queue)
            total += changed
            # Sent inside the transaction, the wake-ups are delivered only on commit.
            for name in queues:
                sql.notify(channel_for(name), "")
    return total


def not_waiting(
    ids: Iterable[int], *, queue: str | None = None, using: str | None = None
) -> list[int]:
    """Return those of ``ids`` that are not live jobs waiting for a retry (of ``queue``), sorted."""
    return _absent(ids, _waiting(using, queue, None))


def _waiting(using: str | None, queue: str | None, tag: str | None) -> QuerySet[Any]:
    """Return the live jobs waiting for a retry (of ``queue``, with ``tag``), by database clock."""
    from .models import Job

    rows = Job.objects.using(_alias(using)).filter(
        state="pending", attempts__gt=0, run_at__gt=_dialect(using).database_now()
    )
    if queue is not None:
        validate_name("queue", queue, allow_reserved=True)
        rows = rows.filter(queue=queue)
    return with_tag(rows, tag)


# --- queue controls ----------------------------------------------------------------


def set_queue_paused(queue: str, paused: bool, *, using: str | None = None) -> bool:
    """Pause or resume ``queue`` (see ``Queue.pause``); False when it already was.

    For the admin and ``manage.py alkstore pause|resume``: a reserved name is
    allowed, so an operator can pause an outbox's queue too.
    """
    from .queues import channel_for

    validate_name("queue", queue, allow_reserved=True)
    return _dialect(using).set_paused(queue, paused, channel_for(queue))


def paused_queues(*, using: str | None = None) -> dict[str, datetime | None]:
    """Return every paused queue with the time it was paused (database clock)."""
    return _dialect(using).paused_queues()
