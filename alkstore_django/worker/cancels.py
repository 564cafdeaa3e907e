"""Cancel requests for the jobs a worker holds: heard, passed to their runs, given a grace.

``Store.cancel_job`` stamps a running job's row and notifies its queue's
channel. The worker's watcher sets ``heard`` on that notification
(PostgreSQL, MariaDB/MySQL); the main thread then reads, in one statement,
which of its held claims carry a request, and also every poll interval
while it holds any, so a notification that was missed (or that the engine
does not carry: SQLite) costs at most that long. Each run found is marked
(``Run.request_cancel``; a child process is told by a signal) and given
until ``cancel_grace_s`` (its queue's option) to end: the time-limit
machinery then stops it (``Completer.stop_overdue_runs``). However the run
ends once asked, its job ends cancelled (``cancelled_outcome``).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from ..executor import Outcome, OutcomeKind, cancelled_error

if TYPE_CHECKING:
    from ..store import Store
    from .holdings import Held, Holdings

logger = logging.getLogger("alkstore_django.worker")

# The error of a job whose claim already carried a request: it is not run.
NOT_STARTED = "cancelled before it started: a cancel was requested before this claim"


class Cancels:
    """Find the held jobs asked to cancel and mark their runs (the worker's main thread only)."""

    def __init__(self, store: Store, holdings: Holdings, poll_interval_s: float) -> None:
        self.store = store
        self.holdings = holdings
        self.poll_interval_s = poll_interval_s
        # Set by the queue watch (worker/wake.py, notify.py) when a cancel notification arrived.
        self.heard = threading.Event()
        self._next_read_at = 0.0

    def check_due(self) -> None:
        """Read the held claims' requests if one was heard or the poll interval has passed."""
        now = time.monotonic()
        if not self.heard.is_set() and now < self._next_read_at:
            return
        self.heard.clear()
        self._next_read_at = now + self.poll_interval_s
        asked: list[Held] = []
        unasked: dict[tuple[int, int], Held] = {}
        for held in self.holdings:
            if held.superseded or held.handle.spent:
                continue
            if held.run.cancel_requested:
                asked.append(held)
            else:
                unasked[(held.handle.job.id, held.handle.job.generation)] = held
        # A child told before its run began would not have heard: telling again is harmless.
        for held in asked:
            if held.lane is not None and held.started_at is not None:
                held.lane.tell_cancel(held.slot)
        if not unasked:
            return
        for fence in self.store.dialect.cancels_requested(list(unasked)):
            self.request(unasked[fence], now)

    def request(self, held: Held, now: float) -> None:
        """Mark ``held``'s run asked to cancel and start its grace."""
        job = held.handle.job
        grace_s = held.handle.queue.options.cancel_grace_s
        held.run.request_cancel()
        held.cancel_by = now + grace_s
        logger.info(
            "cancel requested id=%s queue=%s attempts=%s grace_s=%g",
            job.id,
            job.queue,
            job.attempts,
            grace_s,
        )
        if held.lane is not None and held.started_at is not None:
            held.lane.tell_cancel(held.slot)


def past_grace(held: Held, now: float) -> bool:
    """True when ``held``'s run was asked to cancel and has outlived its grace."""
    return held.cancel_by is not None and now >= held.cancel_by


def cancelled_outcome(held: Held, outcome: Outcome) -> Outcome:
    """Return the outcome of ``held``'s run: ``cancel`` once it was asked to stop, however it ended.

    A return, a failure, a snooze or a killed child after the request all end
    the job cancelled (the attempt's text says how the run ended); so does a
    job never started whose run was asked. Other outcomes pass unchanged.
    """
    if outcome.kind == OutcomeKind.CANCEL or not held.run.cancel_requested:
        return outcome
    if outcome.kind == OutcomeKind.RELEASE:
        error = "cancelled before it started"
    elif outcome.kind == OutcomeKind.ACK:
        error = "cancelled: the handler returned after the cancel request"
    else:
        error = cancelled_error(outcome) if outcome.error else f"cancelled: {outcome.kind}"
    return Outcome(
        OutcomeKind.CANCEL,
        error=error,
        exc=outcome.exc,
        exc_class=outcome.exc_class,
        traceback=outcome.traceback,
        duration_ms=outcome.duration_ms,
    )
