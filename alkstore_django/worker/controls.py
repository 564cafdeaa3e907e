"""The worker's view of its queues' controls: which are paused, and which a limit holds back.

The database enforces the controls inside every claim (``dialects/controls.py``);
this keeps the worker from asking in vain, and from starting a held job of a
queue paused since it was claimed. The main thread alone changes it; handler
threads only read ``paused``, which is replaced, never mutated.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..dialects import AnyDialect
    from ..store import Store

# A queue at its max_running is claimed again when one of this worker's jobs
# of it finishes, or after this long (a job finishing on another worker
# sends no wake-up).
MAX_RUNNING_RECHECK_S = 0.1


class Controls:
    """The paused queues among ``queue_names``, and how long a limit holds each one back.

    ``changed`` is set by the queue watch on a pause or resume notification; the
    paused set is read again then, and every ``poll_interval_s`` regardless.
    """

    def __init__(self, queue_names: Sequence[str], poll_interval_s: float) -> None:
        self.queue_names = list(queue_names)
        self.poll_interval_s = poll_interval_s
        self.paused: frozenset[str] = frozenset()
        # When a limit lets each queue be claimed again (monotonic), and the
        # queues waiting for one of their running jobs to finish here.
        self.holds: dict[str, float] = {}
        self.await_finish: set[str] = set()
        self.changed = threading.Event()
        self._next_check = 0.0

    def hold(self, name: str, hold_s: float | None) -> None:
        """Record how long a limit holds ``name``'s next claim back (None: it does not)."""
        self.await_finish.discard(name)
        if hold_s is None:
            self.holds.pop(name, None)
        elif hold_s == 0.0:
            self.holds[name] = time.monotonic() + MAX_RUNNING_RECHECK_S
            self.await_finish.add(name)
        else:
            self.holds[name] = time.monotonic() + hold_s

    def held_back(self, name: str) -> bool:
        """True while a limit holds ``name``'s next claim back."""
        return self.holds.get(name, 0.0) > time.monotonic()

    def next_release_s(self) -> float | None:
        """Return how soon the first hold ends, in seconds (None: no queue is held back)."""
        now = time.monotonic()
        holds = [until for until in self.holds.values() if until > now]
        return min(holds) - now if holds else None

    def read_if_due(self, store: Store) -> None:
        """Read the paused queues on a pause or resume, and every poll."""
        if self.changed.is_set() or time.monotonic() >= self._next_check:
            self.read(store.dialect)

    def read(self, dialect: AnyDialect) -> None:
        """Read which of the worker's queues are paused.

        The claim itself refuses a paused queue; this is for the jobs already
        held: a handler thread gives back, unstarted, a job of a paused queue.
        """
        self.changed.clear()
        self._next_check = time.monotonic() + self.poll_interval_s
        paused = dialect.paused_queues()
        self.paused = frozenset(name for name in self.queue_names if name in paused)
