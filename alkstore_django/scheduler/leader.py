"""The leader-elected loop that fires the schedules: the lease, the loop, its sleep.

Leadership is a lock (``locks.py``) renewed inside each tick's transaction
and while sleeping; it only keeps the work (and the polling) on one runner:
the tick itself (``fire.py``) never fires a boundary twice. ``serve`` stands
by while another runner leads and survives database outages.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import TYPE_CHECKING

from django.db import (
    DatabaseError,
    InterfaceError,
    OperationalError,
    close_old_connections,
    connections,
)

from ..error_text import describe, loggable
from ..errors import LeadershipLost
from ..locks import LockHandle, acquire, default_owner, validate_owner
from ..notify import Watcher, open_watcher
from ..queues import channel_for
from .fire import leadership_lost, tick
from .registry import SCHEDULES_CHANNEL, register_declared

if TYPE_CHECKING:
    from ..store import Store

logger = logging.getLogger("alkstore_django.scheduler")

LEADER_LOCK = "__alkstore_scheduler"
LEADER_TTL_S = 10.0
RENEW_INTERVAL_S = 2.0
# The sleep is sliced so ``stop`` and a new or changed schedule are seen this fast.
SLEEP_SLICE_S = 1.0
MAX_SLEEP_S = 60.0
STANDBY_RETRY_S = 3.0


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
    return open_watcher(store, [channel_for(SCHEDULES_CHANNEL)])


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
                raise leadership_lost(held)
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
            lost_lead = exc.was_leading
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
