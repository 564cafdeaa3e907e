"""The main thread's wake-up: set by the other threads, and heard on its own LISTEN socket.

Handler threads set it when a job is done or reports progress, a watcher
thread when one of the worker's queues may have work; the main thread waits
on it between rounds. It is an ``Event`` with a socket beside it, so that
the main thread can wait in one ``poll()`` on that socket and on another.

Where the engine's watcher waits on a socket (PostgreSQL's ``LISTEN``
connection), there is no watcher thread: the main thread's wait polls the
watcher's socket too and reads what arrived itself, so a notification
reaches the claim without a hand-off from one thread to another (the
pickup's largest cost after the claim, docs/performance.md). A busy
round, which does not wait, still looks at the socket without waiting, so a
pause or a cancel request is heard as soon as it arrives. Connecting is
the one thing the main thread does not do: a connect can hang until the
server's timeout, so the watch's connection is (re)made in a short-lived
thread of its own while the rounds go on.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..notify import QueueWatch

# A watch without its socket (its connection lost, or never made) is tried
# again this often, not at every round.
RECONNECT_S = 1.0
# How long ``start`` waits for the first connect (usually milliseconds), so
# that the worker's first claim comes after its LISTEN and sees what was
# sent before; a slower one is followed once it is done.
FIRST_CONNECT_S = 1.0


class Wake(threading.Event):
    """``set`` from any thread; ``wait`` and ``clear`` from the main thread only.

    Until ``start`` it is a plain ``Event``; ``start`` opens its socket pair,
    ``close`` closes it.
    """

    def __init__(self) -> None:
        super().__init__()
        self._reader: socket.socket | None = None
        self._writer: socket.socket | None = None
        # The thread that waits: its own sets (the watch it reads) need no byte.
        self._owner: int | None = None
        # True from just before the main thread's blocking wait looks at the
        # flag until its poll returns: only then does a set need its byte.
        self._polling = False
        self.watch: QueueWatch | None = None
        self._watch_fd: int | None = None
        self._retry_at = 0.0
        self._poller: Any = None
        # The thread connecting the watch, and whether it is done with it;
        # ``_lock`` orders its finish, and every byte sent, against ``close``.
        self._opening: threading.Thread | None = None
        self._opened = False
        self._lock = threading.Lock()

    def start(self, watch: QueueWatch | None = None) -> None:
        """Open the socket pair; with ``watch``, read it in this thread's waits once connected.

        A wake may be started again, with a new watch: one still open is
        closed first, its socket pair and watch with it.
        """
        if self._reader is not None:
            self.close()
        self._opening, self._opened = None, False
        self._retry_at, self._watch_fd = 0.0, None
        self._reader, self._writer = socket.socketpair()
        self._reader.setblocking(False)
        self._writer.setblocking(False)
        self._owner = threading.get_ident()
        if hasattr(select, "poll"):
            self._poller = select.poll()
            self._poller.register(self._reader.fileno(), select.POLLIN)
        if watch is not None:
            self.watch = watch
            self._reconnect(watch)
            if self._opening is not None:
                self._opening.join(FIRST_CONNECT_S)
                self._reconnect(watch)  # follows it, if connected by now

    def set(self) -> None:
        """Set the flag; write the byte only if the main thread may be blocked in its poll.

        A busy worker's handler threads set it a few times a batch while the
        main thread never blocks: a byte each time would cost a send, and the
        main thread two reads, for nothing. The flag is set before
        ``_polling`` is read, and ``wait`` sets ``_polling`` before it reads
        the flag, so one of the two always sees the other (the GIL orders
        them): either the wait sees the flag and does not block, or the set
        sees the wait and sends the byte that ends it.
        """
        if self.is_set():
            return
        super().set()
        if self._polling and self._writer is not None and threading.get_ident() != self._owner:
            # Under the lock: a late set (a handler outliving the shutdown) must not
            # write to a number close() gave back and another open reused.
            with self._lock, contextlib.suppress(OSError):
                if self._writer is not None:
                    self._writer.send(b"\0")  # full: a byte already waits

    def wait(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` s (None: until set) for a ``set`` or a wake-up the watch reads.

        ``wait(0)`` only looks. It may return early and unset (a byte left
        from an earlier set): the caller's round then claims only if due.
        """
        reader = self._reader
        if reader is None:
            return super().wait(timeout)
        watch = self.watch
        if watch is not None and self._watch_fd is None:
            self._reconnect(watch)
        if timeout != 0:
            self._polling = True  # before the flag is read: see ``set``
            if self.is_set():
                self._polling = False
                return True
        watch_fd = self._watch_fd
        try:
            if self._poller is not None:
                ms = None if timeout is None else timeout * 1000
                ready = {fd for fd, _ in self._poller.poll(ms)}
            else:  # Windows, whose select() takes sockets
                fds = [reader.fileno()] + ([] if watch_fd is None else [watch_fd])
                ready = set(select.select(fds, [], [], timeout)[0])
        finally:
            self._polling = False
        if reader.fileno() in ready:
            self._drain()
        if watch is not None and watch_fd is not None and watch_fd in ready:
            watch.look(0)
            self._watch_fd = self._follow(watch.fileno())
        elif watch is not None and self._opened:
            self._reconnect(watch)
        return self.is_set()

    def _reconnect(self, watch: QueueWatch) -> None:
        """Connect the watch in a thread of its own, once per ``RECONNECT_S``; follow it once done.

        The main thread does not touch the watch while that thread has it.
        """
        if self._opening is not None:
            if not self._opened:
                return
            self._opening, self._opened = None, False
            self._drain()  # the connecting thread's byte, if sent yet: this wait returns now
            self._watch_fd = self._follow(watch.fileno())
            if self._watch_fd is not None:
                # What was sent before it was (back) up is lost: look now.
                watch.missed()
            return
        now = time.monotonic()
        if now < self._retry_at:
            return
        self._retry_at = now + RECONNECT_S
        self._opening = threading.Thread(
            target=self._open, args=(watch,), name="alkstore-listen-connect", daemon=True
        )
        self._opening.start()

    def _open(self, watch: QueueWatch) -> None:
        try:
            watch.look(0)  # connects, or reconnects, and passes on what already arrived
        finally:
            self._finish_opening(watch)

    def _finish_opening(self, watch: QueueWatch) -> None:
        """Give the watch back to the main thread, or close it if no longer the wake's.

        The wake was closed meanwhile, or closed and started with another watch.
        """
        with self._lock:
            if watch is not self.watch:
                watch.close()
                return
            self._opened = True
        self.set()

    def _drain(self) -> None:
        reader = self._reader
        if reader is not None:
            with contextlib.suppress(BlockingIOError):
                while reader.recv(512):
                    pass

    def _follow(self, fd: int | None) -> int | None:
        """Poll ``fd`` from now on instead of the watch's last socket."""
        if self._poller is not None and fd != self._watch_fd:
            if self._watch_fd is not None:
                with contextlib.suppress(KeyError, ValueError):
                    self._poller.unregister(self._watch_fd)
            if fd is not None:
                self._poller.register(fd, select.POLLIN)
        return fd

    def close(self) -> None:
        """Close the watch and the socket pair; ``set`` still sets the flag after.

        A watch still connecting is closed by its connecting thread when it is done.
        """
        with self._lock:
            watch, self.watch = self.watch, None
            if watch is not None and (self._opening is None or self._opened):
                watch.close()
            for end in (self._reader, self._writer):
                if end is not None:
                    end.close()
            self._reader = self._writer = None
        self._watch_fd = self._poller = None
