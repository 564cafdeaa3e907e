"""Schedules and the leader-elected loop that fires them.

A schedule's boundaries come from its spec value (``specs.py``: ``@every``
epoch multiples or ``@cron`` in the schedule's zone), read against the
database's clock. A tick locks the due rows, enqueues one job per boundary
its misfire policy keeps, records each job's boundary (``ScheduleFire``) and
moves ``next_run_at`` past now, all in one transaction, so even a second
ticker without the leadership lock cannot fire a boundary twice. Leadership
only keeps the work (and the polling) on one runner.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import (
    DatabaseError,
    InterfaceError,
    OperationalError,
    close_old_connections,
    connections,
    transaction,
)

from ..conf import app_settings
from ..error_text import describe, loggable
from ..errors import AlkstoreError, InvalidArgument, LeadershipLost
from ..locks import LockHandle, acquire, default_owner, validate_owner
from ..models import Schedule, ScheduleFire
from ..notify import Watcher, notify, open_watcher
from ..queues import Queue, channel_for
from ..records import Schedule as ScheduleRecord
from ..specs import Spec, boundaries, parse_misfire, parse_spec, parse_zone
from ..validation import (
    encode_payload,
    validate_duration,
    validate_max_attempts,
    validate_name,
    validate_priority,
)

if TYPE_CHECKING:
    from ..store import Store

logger = logging.getLogger("alkstore_django.scheduler")

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
# Under the ``skip`` policy a boundary at most this late is on time, not missed:
# a tick runs a moment after its boundary, and a failover takes about a lease.
MISFIRE_GRACE_S = 60.0
# A refused fire is tried again this often until it fires or an operator acts.
REFUSED_RETRY_S = 30.0
# How long a fired job's boundary stays readable (``fired_for``).
FIRE_KEEP_DAYS = 30
SCHEDULE_KEYS = frozenset(
    {"spec", "queue", "payload", "priority", "max_attempts", "expires_s", "zone", "misfire"}
)


@dataclass(frozen=True)
class Fire:
    """Which schedule fired a job, and for which boundary (an aware UTC datetime)."""

    schedule: str
    boundary: datetime


def check_schedule(
    name: object,
    spec: object,
    queue: object,
    payload: Any = None,
    *,
    priority: object = None,
    max_attempts: object = None,
    expires_s: object = None,
    zone: object = None,
    misfire: object = "all",
) -> dict[str, Any]:
    """Validate a schedule's arguments without touching the database.

    Returns the row's values with the stamps resolved over the target queue's
    derived defaults, and the parsed spec under ``"parsed"``. ``zone`` None
    means ``settings.TIME_ZONE``. Raises ``InvalidSpec`` first (spec, zone,
    misfire), then ``InvalidName``, ``ReservedName``, ``PayloadError`` or
    ``InvalidArgument``. The payload is encoded with ``PAYLOAD_CODEC``, as a
    job's is.
    """
    zone = default_zone() if zone is None else zone
    parse_zone(zone)
    parsed = parse_spec(spec, zone)
    parse_misfire(misfire)
    validate_name("schedule", name)
    validate_name("queue", queue)
    codec = app_settings.payload_codec
    encoded = encode_payload(payload, app_settings.max_payload_bytes, codec.encode)
    defaults = app_settings.queue_defaults(queue)  # type: ignore[arg-type]
    return {
        "name": name,
        "spec": spec,
        "parsed": parsed,
        "interval_s": parsed.interval_s,
        "zone": zone,
        "misfire": misfire,
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


def default_zone() -> str:
    """Return the zone a schedule gets when none is given: ``settings.TIME_ZONE``."""
    return settings.TIME_ZONE or "UTC"


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
    zone: str | None = None,
    misfire: str = "all",
    declared: bool = False,
) -> ScheduleRecord:
    """Register (upsert by name) a schedule and return it as stored.

    The first fire is the first boundary after registration. Re-registering an
    unchanged spec and zone keeps ``next_run_at``; a changed one recomputes
    it. The stamps are resolved over the target queue's derived defaults now,
    at registration; a paused schedule stays paused. ``declared`` marks a
    schedule from ``ALKSTORE["SCHEDULES"]``. Joins the caller's transaction.
    Raises ``InvalidSpec`` (and every other argument error) before any
    database access.
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
        zone=zone,
        misfire=misfire,
    )
    values["declared"] = bool(declared)
    # The upsert is the first statement that touches a table, so on SQLite the
    # transaction takes the write lock before it reads anything.
    with transaction.atomic(using=store.using):
        now = store.dialect.database_now()
        first = values["parsed"].next_after(now)
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
    later removed from settings (``unschedule`` them). A declared schedule
    edited in the admin since is overwritten by its declaration, with a
    warning naming what the edit had changed.
    """
    names = []
    for name, declaration in app_settings.schedules.items():
        arguments = check_declaration(name, declaration)
        edited = (
            Schedule.objects.using(store.using)
            .filter(name=name, admin_edited_at__isnull=False)
            .first()
        )
        record = schedule(store, name, **arguments, declared=True)
        if edited is not None:
            _warn_overwritten(edited, record)
        names.append(name)
    return names


def _warn_overwritten(edited: Schedule, record: ScheduleRecord) -> None:
    changed = [
        f"{field} {getattr(edited, field)!r} -> {getattr(record, field)!r}"
        for field in ("spec", "zone", "misfire", "queue", "priority", "max_attempts", "expires_s")
        if getattr(edited, field) != getattr(record, field)
    ]
    if app_settings.payload_codec.decode(edited.payload) != record.payload:
        changed.append("payload")
    logger.warning(
        "schedule admin edit overwritten by ALKSTORE['SCHEDULES'] name=%s edited_at=%s changes=%s",
        edited.name,
        edited.admin_edited_at.isoformat() if edited.admin_edited_at else None,
        "; ".join(changed) or "none",
    )


def fired_for(store: Store, job_id: int | str) -> Fire | None:
    """Return the schedule and boundary job ``job_id`` was fired for, None if not scheduled.

    Works while the job is live, dead or done, for ``FIRE_KEEP_DAYS`` days
    after its boundary. ``job_id`` may be a Tasks result id (the job id as text).
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
        if fired:
            _prune_fires(store, now - timedelta(days=FIRE_KEEP_DAYS))
    return fired


def _prune_fires(store: Store, cutoff: datetime) -> None:
    """Forget the boundaries of jobs fired before ``cutoff`` (one indexed statement).

    A plain statement: the ORM's ``delete()`` opens a transaction of its own,
    which SQLite's ``BEGIN IMMEDIATE`` tick transaction cannot nest.
    """
    with connections[store.using].cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {ScheduleFire._meta.db_table} WHERE boundary < %s",
            [store.dialect.adapt_datetime(cutoff)],
        )


def due_boundaries(spec: Spec, misfire: str, first: datetime, now: datetime, held: bool) -> list:
    """Return the boundaries to fire now, from ``first`` (the oldest due) to ``now``.

    ``held`` says ``first`` is a boundary whose fire was refused: ``skip``
    keeps it (it was on time when refused) rather than calling it missed.
    """
    if misfire == "latest":
        latest = spec.latest_at_or_before(now)
        return [latest] if latest is not None and latest >= first else []
    if misfire == "skip" and not held:
        on_time = now - timedelta(seconds=MISFIRE_GRACE_S)
        if first < on_time:
            first = spec.next_after(on_time - timedelta(microseconds=1))
    return boundaries(spec, first, now, MAX_FIRES_PER_TICK)


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
    due = due_boundaries(spec, row.misfire, first, now, held)
    next_run_at = spec.next_after(now)
    options = app_settings.queue_defaults(row.queue).overlay(
        {
            "priority": row.priority,
            "max_attempts": row.max_attempts,
            "visibility_timeout_s": row.visibility_timeout_s,
            "retry_base_s": row.retry_base_s,
            "expires_s": row.expires_s,
        }
    )
    rows = Schedule.objects.using(store.using).filter(pk=row.pk)
    try:
        payload = app_settings.payload_codec.decode(row.payload)
        ids = Queue(store, row.queue, options).enqueue_many([payload] * len(due))
    except (AlkstoreError, TypeError, ValueError) as exc:
        error = describe(exc)
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
        return 0
    # One INSERT each (at most 64), not bulk_create: Django 5.2 wraps that in
    # atomic(), which on SQLite issues a BEGIN inside the tick's BEGIN IMMEDIATE.
    fires = ScheduleFire.objects.using(store.using)
    for job_id, boundary in zip(ids, due, strict=True):
        fires.create(job_id=job_id, schedule=row.name, boundary=boundary)
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
    notification) is noticed within a slice. A database error while sleeping
    (a dropped connection, a failover) is logged and the slice retried on a
    new connection: the lease still guards every fire, since the tick renews
    it in its own transaction before firing anything.
    """
    started = renewed = time.monotonic()
    dialect = store.dialect
    until_due: float | None = None
    while not stop.is_set():
        try:
            until_due = dialect.seconds_until_next_fire()
        except DatabaseError as exc:
            _sleep_failed(store, exc)
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
            try:
                kept = held.renew()
            except DatabaseError as exc:
                _sleep_failed(store, exc)
                continue
            if not kept:
                raise _lost(held)
            renewed = time.monotonic()


def _sleep_failed(store: Store, exc: DatabaseError) -> None:
    logger.warning(
        "scheduler database error while sleeping alias=%s error=%s; retrying",
        store.using,
        loggable(describe(exc)),
    )
    connection = connections[store.using]
    if not connection.in_atomic_block:
        with contextlib.suppress(DatabaseError):
            connection.close()


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
