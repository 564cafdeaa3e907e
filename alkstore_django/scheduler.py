"""Interval schedules and the leader-elected loop that fires them.

Boundaries are the multiples of a schedule's interval since the Unix epoch,
read on the database's clock. A tick locks the due rows, enqueues one job per
elapsed boundary and moves ``next_run_at`` past now, all in one transaction,
so even a second ticker without the leadership lock cannot fire a boundary
twice. Leadership only keeps the work (and the polling) on one runner.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from django.db import (
    DatabaseError,
    InterfaceError,
    OperationalError,
    close_old_connections,
    connections,
    transaction,
)

from .conf import app_settings
from .errors import AlkstoreError, InvalidArgument, LeadershipLost
from .locks import LockHandle, acquire, default_owner, validate_owner
from .models import Schedule
from .notify import Watcher, notify, open_watcher
from .queues import Queue, channel_for
from .records import Schedule as ScheduleRecord
from .timing import next_boundary_s, parse_spec
from .validation import (
    encode_payload,
    validate_duration,
    validate_max_attempts,
    validate_name,
    validate_priority,
)

if TYPE_CHECKING:
    from .store import Store

logger = logging.getLogger(__name__)

LEADER_LOCK = "__alkstore_scheduler"
# schedule() and unschedule() notify here so a PostgreSQL leader wakes at once.
SCHEDULES_CHANNEL = "__alkstore_schedules"
LEADER_TTL_S = 10.0
RENEW_INTERVAL_S = 2.0
# The sleep is sliced so ``stop`` and a new or changed schedule are seen this fast.
SLEEP_SLICE_S = 1.0
MAX_SLEEP_S = 60.0
MAX_FIRES_PER_TICK = 64
STANDBY_RETRY_S = 3.0
SCHEDULE_KEYS = frozenset({"spec", "queue", "payload", "priority", "max_attempts", "expires_s"})


def check_schedule(
    name: object,
    spec: object,
    queue: object,
    payload: Any = None,
    *,
    priority: object = None,
    max_attempts: object = None,
    expires_s: object = None,
) -> dict[str, Any]:
    """Validate a schedule's arguments without touching the database.

    Returns the row's values with the stamps resolved over the target queue's
    derived defaults. Raises ``InvalidSpec`` first, then ``InvalidName``,
    ``ReservedName``, ``PayloadError`` or ``InvalidArgument``.
    """
    interval_s = parse_spec(spec)
    validate_name("schedule", name)
    validate_name("queue", queue)
    encoded = encode_payload(payload, app_settings.max_payload_bytes)
    defaults = app_settings.queue_defaults(queue)  # type: ignore[arg-type]
    return {
        "name": name,
        "spec": spec,
        "interval_s": interval_s,
        "queue": queue,
        "payload": encoded,
        "priority": defaults.priority if priority is None else validate_priority(priority),
        "max_attempts": (
            defaults.max_attempts if max_attempts is None else validate_max_attempts(max_attempts)
        ),
        "visibility_timeout_s": defaults.visibility_timeout_s,
        "retry_base_s": defaults.retry_base_s,
        "expires_s": (
            defaults.expires_s
            if expires_s is None
            else validate_duration("expires_s", expires_s, allow_zero=False)
        ),
    }


def check_declaration(name: object, declaration: object) -> dict[str, Any]:
    """Validate one ``ALKSTORE["SCHEDULES"]`` entry; return the ``schedule()`` arguments."""
    if not isinstance(declaration, dict):
        raise InvalidArgument(
            f"Invalid schedule declaration {declaration!r}: expected a dict with keys "
            f"{', '.join(sorted(SCHEDULE_KEYS))}."
        )
    unknown = sorted(set(declaration) - SCHEDULE_KEYS)
    if unknown:
        raise InvalidArgument(
            f"Unknown schedule key {unknown[0]!r}: expected one of "
            f"{', '.join(sorted(SCHEDULE_KEYS))}."
        )
    missing = sorted({"spec", "queue"} - set(declaration))
    if missing:
        raise InvalidArgument(f"Missing schedule key {missing[0]!r}: spec and queue are required.")
    check_schedule(name, **declaration)
    return dict(declaration)


def _from_epoch(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)


def schedule(
    store: Store,
    name: str,
    spec: str,
    queue: str,
    payload: Any = None,
    *,
    priority: int | None = None,
    max_attempts: int | None = None,
    expires_s: float | None = None,
) -> ScheduleRecord:
    """Register (upsert by name) a schedule and return it as stored.

    The first fire is the first boundary after registration. Re-registering an
    unchanged spec keeps ``next_run_at``; a changed spec recomputes it. The
    stamps are resolved over the target queue's derived defaults now, at
    registration; a paused schedule stays paused. Joins the caller's
    transaction. Raises ``InvalidSpec`` (and every other argument error)
    before any database access.
    """
    store.check_open()
    values = check_schedule(
        name,
        spec,
        queue,
        payload,
        priority=priority,
        max_attempts=max_attempts,
        expires_s=expires_s,
    )
    # The upsert is the first statement that touches a table, so on SQLite the
    # transaction takes the write lock before it reads anything.
    with transaction.atomic(using=store.using):
        now = store.dialect.database_now()
        first = _from_epoch(next_boundary_s(now.timestamp(), values["interval_s"]))
        store.dialect.upsert_schedule(values, first)
        notify(store, SCHEDULES_CHANNEL, name)
        row = Schedule.objects.using(store.using).get(name=name)
    logger.info(
        "schedule registered name=%s spec=%s queue=%s next_run_at=%s",
        name,
        spec,
        queue,
        row.next_run_at.isoformat(),
    )
    return row.to_record()


def unschedule(store: Store, name: str) -> bool:
    """Delete the schedule ``name``; False when there is none."""
    store.check_open()
    validate_name("schedule", name)
    with transaction.atomic(using=store.using):
        deleted, _ = Schedule.objects.using(store.using).filter(name=name).delete()
        if deleted:
            notify(store, SCHEDULES_CHANNEL, name)
    return deleted > 0


def register_declared(store: Store) -> list[str]:
    """Register every schedule in ``ALKSTORE["SCHEDULES"]``; return their names.

    Schedules registered through the API are left alone, as are declared ones
    later removed from settings (``unschedule`` them).
    """
    names = []
    for name, declaration in app_settings.schedules.items():
        schedule(store, name, **check_declaration(name, declaration))
        names.append(name)
    return names


def tick(store: Store, *, leader: LockHandle | None = None) -> int:
    """Fire every due schedule once per elapsed boundary; return how many jobs were enqueued.

    One transaction: it renews ``leader`` (raising ``LeadershipLost``, with
    nothing fired, when the lease is gone), locks the due rows (``SELECT … FOR
    UPDATE``; a ``BEGIN IMMEDIATE`` write transaction on SQLite), enqueues the
    oldest elapsed boundaries, at most 64 per schedule, then moves each row's
    ``next_run_at`` to the first boundary after now. Boundaries past the 64
    are skipped, never fired later.
    """
    store.check_open()
    dialect = store.dialect
    fired = 0
    with dialect.write_transaction():
        if leader is not None and not leader.renew():
            raise _lost(leader)
        now = dialect.database_now()
        due = (
            Schedule.objects.using(store.using)
            .select_for_update()
            .filter(enabled=True, next_run_at__lte=now)
            .order_by("next_run_at", "id")
        )
        for row in due:
            fired += _fire(store, row, now)
    return fired


def _fire(store: Store, row: Schedule, now: datetime) -> int:
    """Enqueue ``row``'s elapsed boundaries and advance it; part of the tick's transaction."""
    now_s = now.timestamp()
    elapsed = math.floor((now_s - row.next_run_at.timestamp()) / row.interval_s) + 1
    count = min(elapsed, MAX_FIRES_PER_TICK)
    options = app_settings.queue_defaults(row.queue).overlay(
        {
            "priority": row.priority,
            "max_attempts": row.max_attempts,
            "visibility_timeout_s": row.visibility_timeout_s,
            "retry_base_s": row.retry_base_s,
            "expires_s": row.expires_s,
        }
    )
    next_run_at = _from_epoch(next_boundary_s(now_s, row.interval_s))
    try:
        Queue(store, row.queue, options).enqueue_many([row.payload] * count)
    except AlkstoreError:
        # Refused before any write (say MAX_PAYLOAD_BYTES shrank): skip these
        # boundaries rather than block every other schedule's tick forever.
        logger.error("schedule fire refused name=%s queue=%s", row.name, row.queue, exc_info=True)
        count = 0
    Schedule.objects.using(store.using).filter(pk=row.pk).update(
        next_run_at=next_run_at, last_fired_at=now if count else row.last_fired_at
    )
    logger.info(
        "schedule fired name=%s queue=%s fired=%d skipped=%d next_run_at=%s",
        row.name,
        row.queue,
        count,
        max(elapsed - count, 0),
        next_run_at.isoformat(),
    )
    return count


def _lost(held: LockHandle) -> LeadershipLost:
    return LeadershipLost(
        f"Scheduler lock {held.name!r} was lost by owner {held.owner!r}: another runner leads now."
    )


def run_schedules(store: Store, stop: threading.Event, *, owner: str | None = None) -> None:
    """Lead the schedules until ``stop`` is set, then release leadership and return.

    Leadership is the lock ``__alkstore_scheduler`` (TTL 10 s) under ``owner``,
    a token unique to this runner by default. It is renewed at the top of
    every iteration (inside the tick's transaction) and every 2 s while
    sleeping; the sleep lasts until the soonest ``next_run_at`` (at most 60 s)
    and is sliced by the second, so ``stop`` and a new or changed schedule are
    seen within about a second. The declared ``ALKSTORE["SCHEDULES"]`` are
    registered once leadership is taken. Raises ``LeadershipLost``, before
    firing anything more, when the lock is refused or a renewal finds it lost.
    """
    store.check_open()
    owner = default_owner() if owner is None else validate_owner(owner)
    held = acquire(store, LEADER_LOCK, ttl_s=LEADER_TTL_S, owner=owner)
    if held is None:
        raise LeadershipLost(
            f"Scheduler lock {LEADER_LOCK!r} is held by another runner: standing by."
        )
    logger.info("scheduler leading owner=%s fence=%d", owner, held.fence)
    watcher = _open_wakeups(store)
    try:
        register_declared(store)
        while not stop.is_set():
            if not connections[store.using].in_atomic_block:
                close_old_connections()
            tick(store, leader=held)
            _sleep(store, stop, held, watcher)
    finally:
        if watcher is not None:
            watcher.close()
        _release(held)


def _open_wakeups(store: Store) -> Watcher | None:
    """Return a LISTEN on the schedules channel where the engine pushes wake-ups, else None.

    Without push wake-ups the per-second read of the soonest ``next_run_at``
    in ``_sleep`` is what notices a new or changed schedule.
    """
    if not store.dialect.supports_listen_notify:
        return None
    return open_watcher(store, [channel_for(SCHEDULES_CHANNEL)], app_settings.listen_database)


def _sleep(store: Store, stop: threading.Event, held: LockHandle, watcher: Watcher | None) -> None:
    """Sleep until the soonest schedule is due (at most 60 s), renewing every 2 s.

    Each slice re-reads the soonest ``next_run_at``, so a schedule registered,
    changed or resumed meanwhile (even from the admin, which sends no
    notification) is noticed within a slice.
    """
    started = renewed = time.monotonic()
    dialect = store.dialect
    while not stop.is_set():
        until_due = dialect.seconds_until_next_fire()
        remaining = min(
            MAX_SLEEP_S if until_due is None else until_due,
            MAX_SLEEP_S - (time.monotonic() - started),
        )
        if remaining <= 0:
            return
        slice_s = min(remaining, SLEEP_SLICE_S)
        if watcher is not None:
            watcher.wait(slice_s)
        else:
            stop.wait(slice_s)
        if stop.is_set():
            return
        if time.monotonic() - renewed >= RENEW_INTERVAL_S:
            if not held.renew():
                raise _lost(held)
            renewed = time.monotonic()


def _release(held: LockHandle) -> None:
    try:
        released = held.release()
    except DatabaseError:
        # The database is unreachable: the lease simply lapses after its TTL.
        logger.warning("scheduler could not release leadership owner=%s", held.owner)
        return
    if released:
        logger.info("scheduler released leadership owner=%s", held.owner)


def serve(
    store: Store,
    stop: threading.Event,
    *,
    retry_s: float = STANDBY_RETRY_S,
    owner: str | None = None,
) -> None:
    """Run ``run_schedules`` until ``stop`` is set, standing by while another runner leads.

    On ``LeadershipLost`` it retries every ``retry_s`` seconds. A database
    outage is logged, the connections closed, and retried at the same pace,
    so the scheduler survives a database restart. Returns when ``stop`` is set.
    """
    owner = default_owner() if owner is None else owner
    standing_by = False
    outage = False
    while not stop.is_set():
        try:
            if outage:
                store.dialect.database_now()
                logger.info("scheduler database reachable again alias=%s", store.using)
                outage = False
            run_schedules(store, stop, owner=owner)
            return
        except LeadershipLost as exc:
            # A lease lost while leading is always worth a line; repeated
            # refusals while standing by are not.
            lost_lead = "was lost" in str(exc)
            if lost_lead or not standing_by:
                level = logging.WARNING if lost_lead else logging.INFO
                logger.log(level, "scheduler standing by owner=%s reason=%s", owner, exc)
            standing_by = True
        except (OperationalError, InterfaceError) as exc:
            if not outage:
                logger.error(
                    "scheduler database unavailable alias=%s error=%s; retrying every %ss",
                    store.using,
                    exc,
                    retry_s,
                    exc_info=True,
                )
            outage = True
            standing_by = False
            with contextlib.suppress(DatabaseError):
                connections[store.using].close()
        stop.wait(retry_s)
