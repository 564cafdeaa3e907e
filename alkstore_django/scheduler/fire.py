"""The tick: every due schedule fired in one transaction, by its misfire policy.

A tick locks the due rows, enqueues one job per boundary its misfire policy
(``specs.MisfirePolicy``) keeps, records each job's boundary
(``ScheduleFire``) and moves ``next_run_at`` past now, all in one
transaction, so even a second ticker without the leadership lock cannot fire
a boundary twice.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.db.models import QuerySet

from ..conf import QueueOptions, app_settings
from ..error_text import describe, loggable
from ..errors import AlkstoreError, InvalidArgument, LeadershipLost
from ..locks import LockHandle
from ..models import Schedule, ScheduleFire
from ..queues import Queue
from ..specs import misfire_policy, parse_spec

if TYPE_CHECKING:
    from ..store import Store

logger = logging.getLogger("alkstore_django.scheduler")

# How long a fire into a queue on another database keeps its boundary's key
# (``_fire_elsewhere``): one row per fire, so a day, not the fires' retention.
ROUTED_FIRE_WINDOW_S = 86_400.0
# A refused fire is tried again this often until it fires or an operator acts.
REFUSED_RETRY_S = 30.0


@dataclass(frozen=True)
class Fire:
    """Which schedule fired a job, and for which boundary (an aware UTC datetime)."""

    schedule: str
    boundary: datetime


def fired_for(store: Store, job_id: int | str) -> Fire | None:
    """Return the schedule and boundary job ``job_id`` was fired for, None if not scheduled.

    Works while the job is live, dead or done, for ``SCHEDULE_FIRE_RETENTION_S``
    (30 days) after its boundary. ``job_id`` may be a Tasks result id (the job id as text).
    """
    try:
        key = int(job_id)
    except (TypeError, ValueError):
        raise InvalidArgument(
            f"Invalid job id {job_id!r}: expected a job id (an integer, or its text)."
        ) from None
    row = ScheduleFire.objects.using(store.using).filter(job_id=key).first()
    return None if row is None else Fire(row.schedule, row.boundary)


def tick(store: Store, *, leader: LockHandle | None = None) -> int:
    """Fire every due schedule once per elapsed boundary; return how many jobs were enqueued.

    One transaction: it renews ``leader`` (raising ``LeadershipLost``, with
    nothing fired, when the lease is gone), locks the due rows (``SELECT … FOR
    UPDATE``; a ``BEGIN IMMEDIATE`` write transaction on SQLite), enqueues the
    boundaries each row's misfire policy keeps (``all``: the oldest, at most
    64; ``latest``: the most recent; ``skip``: those at most 60 s late), then
    moves each row's ``next_run_at`` to the first boundary after now.
    Boundaries past the 64 are skipped, never fired later. A refused fire
    (``_fire``) stays due.
    """
    store.check_open()
    dialect = store.dialect
    fired = 0
    with dialect.write_transaction():
        if leader is not None and not leader.renew():
            raise leadership_lost(leader)
        now = dialect.database_now()
        due = (
            Schedule.objects.using(store.using)
            .select_for_update()
            .filter(enabled=True, next_run_at__lte=now)
            .order_by("next_run_at", "id")
        )
        for row in due:
            fired += _fire(store, row, now)
        if fired:
            # One indexed batch (a dialect's: the ORM's delete() would open a
            # transaction SQLite's BEGIN IMMEDIATE cannot nest): each firing
            # tick deletes at most PRUNE_BATCH_SIZE, more than it fires.
            keep = timedelta(seconds=app_settings.schedule_fire_retention_s)
            dialect.prune_fires(now - keep, app_settings.prune_batch_size)
    return fired


def leadership_lost(held: LockHandle) -> LeadershipLost:
    """Return the error for a lease ``held`` that a renewal found gone."""
    return LeadershipLost(
        f"Scheduler lock {held.name!r} was lost by owner {held.owner!r}: another runner leads now.",
        was_leading=True,
    )


def _fire(store: Store, row: Schedule, now: datetime) -> int:
    """Enqueue ``row``'s due boundaries and advance it; part of the tick's transaction.

    A fire refused before any write (say the payload is now over a lowered
    ``MAX_PAYLOAD_BYTES``) fires nothing, keeps its boundaries due
    (``refused_from``), stores the refusal on the row (``last_error``, shown
    by the admin and ``alkstore schedules``) and is tried again in 30 s,
    rather than blocking every other schedule's tick.
    """
    spec = parse_spec(row.spec, row.zone)
    held = row.refused_from is not None
    first = row.refused_from if row.refused_from is not None else row.next_run_at
    due = misfire_policy(row.misfire).due(spec, first, now, held=held)
    next_run_at = spec.next_after(now)
    stamps = _stamps(row)
    rows = Schedule.objects.using(store.using).filter(pk=row.pk)
    target = store.of_queue(row.queue)
    here = target.using == store.using
    try:
        payload = app_settings.payload_codec.decode(row.payload)
        queue = Queue(target, row.queue, stamps)
        if here:
            ids = queue.enqueue_many([payload] * len(due))
        else:
            ids = _fire_elsewhere(queue, row, payload, due)
    except (AlkstoreError, TypeError, ValueError) as exc:
        _hold(row, rows, first, now, describe(exc))
        return 0
    # One INSERT each (at most 64), not bulk_create: Django 5.2 wraps that in
    # atomic(), which on SQLite issues a BEGIN inside the tick's BEGIN IMMEDIATE.
    fires = ScheduleFire.objects.using(target.using)
    for job_id, boundary in zip(ids, due, strict=True):
        if here:
            fires.create(job_id=job_id, schedule=row.name, boundary=boundary)
        else:
            fires.get_or_create(
                job_id=job_id, defaults={"schedule": row.name, "boundary": boundary}
            )
    rows.update(
        next_run_at=next_run_at,
        refused_from=None,
        last_fired_at=now if due else row.last_fired_at,
    )
    logger.info(
        "schedule fired name=%s queue=%s policy=%s fired=%d first=%s next_run_at=%s",
        row.name,
        row.queue,
        row.misfire,
        len(due),
        due[0].isoformat() if due else None,
        next_run_at.isoformat(),
    )
    return len(due)


def fire_key(schedule: str, boundary: datetime) -> str:
    """Return the unique key of ``schedule``'s job for ``boundary`` (fixed length, any name)."""
    digest = hashlib.sha256(f"{schedule}\0{boundary.isoformat()}".encode()).hexdigest()
    return f"alkstore.fire:{digest[:40]}"


def _fire_elsewhere(queue: Queue, row: Schedule, payload: object, due: list[datetime]) -> list[int]:
    """Enqueue ``due`` on a queue routed to another database; return the jobs' ids.

    No transaction spans two databases, so the jobs commit before the tick
    does. Each boundary's job carries a unique key held ``ROUTED_FIRE_WINDOW_S``
    after it ran: a tick that rolls back after this (a lost lease, a crash)
    fires the boundary again on its next round and gets back the job already
    written, never a second one (unless the scheduler's database stays away
    for longer than the window in between). Its fire is recorded on the queue's database, where
    ``fired_for`` on that database's store reads it.
    """
    keys = [fire_key(row.name, boundary) for boundary in due]
    return queue.enqueue_many(
        [payload] * len(due), unique_keys=keys, unique_for_s=ROUTED_FIRE_WINDOW_S
    )


def _stamps(row: Schedule) -> QueueOptions:
    """Return the stamps resolved at registration, over the queue's current defaults."""
    return app_settings.queue_defaults(row.queue).overlay(
        {
            "priority": row.priority,
            "max_attempts": row.max_attempts,
            "visibility_timeout_s": row.visibility_timeout_s,
            "retry_base_s": row.retry_base_s,
            "expires_s": row.expires_s,
        }
    )


def _hold(
    row: Schedule, rows: QuerySet[Schedule], first: datetime, now: datetime, error: str
) -> None:
    """Keep a refused fire's boundaries due from ``first``; store why; retry in 30 s."""
    logger.error(
        "schedule fire refused name=%s queue=%s held_from=%s error=%s",
        row.name,
        row.queue,
        first.isoformat(),
        loggable(error),
    )
    rows.update(
        next_run_at=now + timedelta(seconds=REFUSED_RETRY_S),
        refused_from=first,
        last_error=error,
        last_error_at=now,
    )
