"""When the worker claims next: the poll, what falls due, the rechecks after a wake-up.

An idle loop still wakes every ``STOP_CHECK_S`` to see a stop, settle what
returned and renew its claims; each of those wakes must not cost an empty
claim. So a round claims only when something may have made work claimable
(a wake-up, a job that came back, a pause or resume) or when the claim the
last claim round set falls due: the poll, a delayed job or a lapsing claim,
a limit's hold ending, the ack linger, the rechecks after a wake-up.

On PostgreSQL producers leave a queue's wake-up out for
``NOTIFY_COALESCE_S`` after one they sent (``dialects/postgresql/wakeups.py``),
and out altogether while no worker of the queue waits: the cadence keeps
this worker's ``LiveWorker.waiting`` flag true to what its last claim found,
and claims again one and two windows after each wake-up heard, or the flag,
to find what they left unannounced.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from .. import presence
from ..conf import COALESCE_RECHECKS, app_settings
from .completer import ACK_LINGER_S
from .upkeep import announce

if TYPE_CHECKING:
    from .loop import Worker


class Cadence:
    """The main thread's schedule of claims; ``heard`` alone is called from the watcher."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        dialect = worker.store.dialect
        self.coalesce_s = app_settings.notify_coalesce_s if dialect.supports_listen_notify else 0.0
        # Whether the last claim round found the queues drained, and when the next claim is due.
        self.drained = False
        self.claim_at = 0.0
        # When the last wake-up was heard (written by the watcher's thread
        # only), and when the last claim round began.
        self.heard_at = float("-inf")
        self.filled_at = 0.0
        # What this worker's live-worker row says: whether it waits for
        # wake-ups, and since when; written after the first claim (None:
        # not yet). Kept only where producers read it.
        self.waiting: bool | None = None
        self.waiting_at = float("-inf")

    def heard(self) -> None:
        """Note a wake-up heard: claim again one and two windows later."""
        self.heard_at = time.monotonic()

    def wait_unclaimed(self, woken: bool) -> float | None:
        """Return how long to wait when this round need not claim; None when it claims."""
        now = time.monotonic()
        if woken or not self.drained or now >= self.claim_at:
            return None
        return max(min(self.claim_at, self.worker.holdings.next_beat) - now, 0.0)

    def claiming(self) -> None:
        """Note that a claim round begins (a recheck before it is spent)."""
        self.filled_at = time.monotonic()

    def claimed(self, drained: bool) -> None:
        """Tell producers whether this worker now waits for wake-ups, if they ask."""
        if self.coalesce_s and drained != self.waiting:
            self._say_waiting(drained)

    def next_claim(self) -> float:
        """Set when the claim after an idle round is due; return the wait."""
        timeout = self.idle_timeout()
        self.claim_at = time.monotonic() + timeout
        return timeout

    def idle_timeout(self) -> float:
        """Return the time to the soonest of the reasons to claim again."""
        worker = self.worker
        holdings = worker.holdings
        timeout = min(worker.poll_interval_s, max(holdings.next_beat - time.monotonic(), 0.0))
        release_s = worker.controls.next_release_s()
        if release_s is not None:
            timeout = min(timeout, release_s)
        if worker.completer.acks:
            timeout = min(timeout, ACK_LINGER_S)
        # The next of the claims one and two windows after the last wake-up
        # heard (or the flag), that no claim has begun since.
        since = max(self.heard_at, self.waiting_at)
        for windows in range(1, COALESCE_RECHECKS + 1):
            recheck_at = since + windows * self.coalesce_s
            if recheck_at > self.filled_at:
                timeout = min(timeout, recheck_at - time.monotonic())
                break
        if self.drained and len(holdings) < worker.capacity:
            queues = worker.queues
            due = worker.store.dialect.next_due_at([q.name for q in queues])
            if due is not None:
                timeout = min(timeout, due)
        return max(timeout, 0.0)

    def _say_waiting(self, waiting: bool) -> None:
        """Write ``LiveWorker.waiting``.

        A worker whose last claim found more than it could take claims again
        on its own as it frees up: producers leave its queues' notifications
        out meanwhile. Once it waits, an enqueue that looked just before the
        flag committed sent none; it committed within two windows of looking
        (``wakeups.py``), so the claim two windows after the flag finds it.
        """
        worker = self.worker
        using = worker.store.using
        if not presence.set_waiting(using, worker.worker_id, waiting):
            announce(worker, worker.store, worker.queues)  # the row was gone: it says waiting
            presence.set_waiting(using, worker.worker_id, waiting)
        self.waiting = waiting
        if waiting:
            self.waiting_at = time.monotonic()
