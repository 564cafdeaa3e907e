"""SQLite's and MariaDB's watch of the queues: a thread of its own that sets the wake-up.

Their watchers have no socket the main thread could wait on (SQLite's file,
MariaDB's poll), so the watch runs in this thread; PostgreSQL's is read by
the main thread itself (``wake.py``).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

from django.db import connections

from ..executor import tidy_connections
from ..notify import QueueWatch, watch_queues


class WatcherThread:
    """The watch ``make_watch(interrupt_fd)`` in a thread, until ``halt`` is set and ``stop``."""

    def __init__(self, make_watch: Callable[[int], QueueWatch], halt: threading.Event) -> None:
        # Written at ``stop``, so the watcher's wait ends then rather than at its next
        # look. A socket pair, not a pipe: every platform's select() takes a socket.
        self._pair = socket.socketpair()
        try:
            watch = make_watch(self._pair[0].fileno())
            self._thread = threading.Thread(
                target=self._watch, args=(watch, halt), name="alkstore-watch", daemon=True
            )
            self._thread.start()
        except BaseException:
            self._close_pair()
            raise

    @staticmethod
    def _watch(watch: QueueWatch, halt: threading.Event) -> None:
        watch_queues(watch, halt)
        tidy_connections(connections.close_all)

    def stop(self) -> None:
        """End the watcher's wait now (``halt`` is set): it returns as soon as it sees it."""
        self._pair[1].send(b"\0")

    def join(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the thread to end; then close the pair."""
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            # A watcher still inside a wait keeps the pair: a closed number could be reused.
            self._close_pair()

    def _close_pair(self) -> None:
        for end in self._pair:
            end.close()
