"""Coalesced queue wake-ups: one ``NOTIFY`` per queue per ``NOTIFY_COALESCE_S`` per process,
and only while a worker of the queue waits.

Every commit that sent a notification takes PostgreSQL's one notification
lock and holds it through its WAL flush, so enqueuers that each notify commit
one at a time: eight producers enqueueing one by one reached about half the
rate of the same inserts without the notification. So an enqueue sends none
when no worker of its queue waits (``LiveWorker.waiting``: every worker is
busy, and claims again as it frees up) or when its process sent one for the
queue less than the window before.

Nothing waits on the saving. A wake-up decided at some moment (sent, or
left out because no worker waited) covers the jobs that commit within two
windows after it (``COALESCE_RECHECKS``):

- a worker claims again one and two windows after every wake-up it hears
  (``Cadence.heard``), and that wake-up was sent after it was decided;
- a worker claims again one and two windows after it starts to wait (its
  flag committed), and an enqueue that saw no worker waiting looked before
  that.

An enqueue is left quiet only within one window of the last wake-up, so
most coalesced jobs are found by the first of those claims; the second
covers the ones whose commits were slow. It keeps coalescing on under load:
with a single claim a window later, an enqueue that commits in more than
half the window could never be left quiet (it needs its commit time twice
over to spare), and at eight producers with a worker waiting every commit
notified, as with no window at all.

Whether a job committed inside its reach is checked after its commit
(after the statement in autocommit, ``on_commit`` in a transaction); one that
committed later asks again, by then with its row committed: a worker that
waits from then on finds it at its next claim.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ...conf import COALESCE_RECHECKS

logger = logging.getLogger("alkstore_django.dialects.postgresql")


class Wakeups:
    """The wake-ups this process decided: when each channel's last was.

    Shared by the threads of the process (one per dialect, so per database).
    A race between two threads costs at most one notification more: a time
    is recorded only once its enqueue has committed, so any time read
    belongs to a decision the workers were covered by.
    """

    def __init__(self) -> None:
        self._sent_at: dict[str, float] = {}
        # How long the last enqueue took to commit: a quiet one must commit
        # within the last recheck's window, or ``settle`` spends a statement on
        # a wake-up.
        self._took_s = 0.0

    def quiet(self, channel: str, window_s: float, now: float) -> bool:
        """Return True when an enqueue at ``now`` may leave its wake-up out.

        Within one window of the last wake-up, and only while it can still
        commit within two (twice the last enqueue's time to spare): one that
        commits past them asks for a wake-up of its own, a second round trip,
        where one in the statement costs nothing more.
        """
        sent_at = self._sent_at.get(channel)
        if sent_at is None:
            return False
        # Leaving twice the last commit's time before the last recheck.
        spare_s = COALESCE_RECHECKS * window_s - 2 * self._took_s
        return now - sent_at < min(window_s, spare_s)

    def committed(self, channel: str, sent_at: float) -> None:
        """Record a wake-up on ``channel`` decided at ``sent_at`` that has committed."""
        if sent_at > self._sent_at.get(channel, float("-inf")):
            self._sent_at[channel] = sent_at

    def settle(
        self,
        channel: str,
        sent_at: float,
        quiet: bool,
        woke: bool,
        window_s: float,
        wake: Callable[[], None],
    ) -> None:
        """After an enqueue committed: record its wake-up, or make sure one covers it.

        ``woke`` says the statement sent one. One that looked and found no
        worker waiting is covered if it committed within two windows after it
        looked (before ``sent_at`` plus the reach); a quiet one, if a
        recorded wake-up was decided less than the reach before its commit.
        Otherwise ``wake`` asks again, recorded as decided when it was asked
        (before any worker can hear it); if that fails the job is still found
        by the workers' poll, so it is logged rather than raised into the
        caller's committed work.
        """
        now = time.monotonic()
        self._took_s = now - sent_at
        reach_s = COALESCE_RECHECKS * window_s
        if not quiet and (woke or now - sent_at <= reach_s):
            self.committed(channel, sent_at)
            return
        last = self._sent_at.get(channel)
        if quiet and last is not None and now - last <= reach_s:
            return
        try:
            wake()
        except Exception:
            logger.warning(
                "could not send a wake-up channel=%s; workers find the job at their next poll",
                channel,
                exc_info=True,
            )
            return
        self.committed(channel, now)
