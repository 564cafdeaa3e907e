"""Coalesced queue wake-ups: one ``NOTIFY`` per queue per ``NOTIFY_COALESCE_S`` per process.

Every commit that sent a notification takes PostgreSQL's one notification
lock and holds it through its WAL flush, so enqueuers that each notify commit
one at a time: eight producers enqueueing one by one reached about half the
rate of the same inserts without the notification. A process therefore
leaves the notification out of an enqueue that follows one of its own
committed wake-ups by less than the window.

Nothing waits on the saving. A worker claims again one window after every
wake-up it hears (``Worker.heard``), and that wake-up was sent before it was
heard; so a job left without a notification is seen as long as it committed
within the window of a wake-up sent before it. That is checked after its
commit (after the statement in autocommit, ``on_commit`` in a transaction),
and a job that committed later sends a wake-up of its own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

logger = logging.getLogger("alkstore_django.dialects.postgresql")


class Wakeups:
    """The wake-ups this process committed: when each channel's last was sent.

    Shared by the threads of the process (one per dialect, so per database).
    A race between two threads costs at most one notification more: a time
    is recorded only once its notification has committed, so any time read
    belongs to a wake-up the workers were sent.
    """

    def __init__(self) -> None:
        self._sent_at: dict[str, float] = {}
        # How long the last enqueue took to commit: a quiet one must commit
        # inside the window, or ``settle`` spends a statement on a wake-up.
        self._took_s = 0.0

    def quiet(self, channel: str, window_s: float, now: float) -> bool:
        """Return True when an enqueue at ``now`` may leave its notification out.

        Only while it can still commit inside the window (twice the last
        enqueue's time to spare): one that commits past it sends a wake-up of
        its own, a second round trip, where a notification in the statement
        costs nothing more.
        """
        sent_at = self._sent_at.get(channel)
        return sent_at is not None and now - sent_at < window_s - 2 * self._took_s

    def committed(self, channel: str, sent_at: float) -> None:
        """Record a wake-up on ``channel`` sent at ``sent_at`` that has committed."""
        if sent_at > self._sent_at.get(channel, float("-inf")):
            self._sent_at[channel] = sent_at

    def settle(
        self,
        channel: str,
        sent_at: float,
        quiet: bool,
        window_s: float,
        notify: Callable[[str], None],
    ) -> None:
        """After an enqueue committed: record its wake-up, or make sure one covers it.

        A quiet enqueue is covered by a committed wake-up sent less than the
        window before now (its commit). Otherwise ``notify`` sends one; if
        that fails the job is still found by the workers' poll, so it is
        logged rather than raised into the caller's committed work.
        """
        now = time.monotonic()
        self._took_s = now - sent_at
        if not quiet:
            self.committed(channel, sent_at)
            return
        last = self._sent_at.get(channel)
        if last is not None and now - last <= window_s:
            return
        try:
            notify(channel)
        except Exception:
            logger.warning(
                "could not send a wake-up channel=%s; workers find the job at their next poll",
                channel,
                exc_info=True,
            )
            return
        self.committed(channel, now)
