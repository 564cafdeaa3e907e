"""Wake-ups: ``store.notify`` / ``store.listen`` over the engine's watcher.

Each engine brings its own substrate (``Dialect.open_watcher``): ``NOTIFY`` /
``LISTEN`` on PostgreSQL, a watch on the database file on SQLite, a short
adaptive poll on MariaDB/MySQL. Queue wake-ups ride the same watchers: a
queue's channel is ``channel_for(queue)``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from threading import Event
from typing import TYPE_CHECKING

from .conf import app_settings
from .dialects import Watcher
from .dialects.cancels import CANCEL_PAYLOAD_PREFIX
from .dialects.controls import CONTROL_PAYLOAD
from .errors import InvalidArgument
from .queues import Queue, channel_for
from .records import Notification
from .validation import is_encodable, validate_duration, validate_name

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from .store import Store

# PostgreSQL refuses NOTIFY payloads of 8,000 bytes or more.
MAX_NOTIFY_PAYLOAD_BYTES = 7999
# A stopping worker (SQLite, MariaDB/MySQL) joins its watcher thread, which
# sees the halt only between two waits: a long wait held every stop, a
# --burst drain's exit included, up to that long (a second added to a 2-second
# drain). An idle wake-up costs microseconds, and the engines' own poll
# intervals are shorter.
HALT_CHECK_S = 0.1


def notify(store: Store, channel: str, payload: str = "") -> None:
    """Send ``payload`` on ``channel``; inside a transaction it is delivered only on commit."""
    validate_name("channel", channel, allow_reserved=True)
    if not isinstance(payload, str):
        raise InvalidArgument(f"Invalid notify payload {payload!r}: expected a string.")
    size = len(payload.encode("utf-8", errors="replace"))
    if size > MAX_NOTIFY_PAYLOAD_BYTES or "\x00" in payload or not is_encodable(payload):
        raise InvalidArgument(
            f"Invalid notify payload of {size} bytes: expected at most "
            f"{MAX_NOTIFY_PAYLOAD_BYTES} bytes of text without NUL characters or lone surrogates."
        )
    store.dialect.notify(channel_for(channel), payload)


def listen(store: Store, channels: Sequence[str], timeout_s: float) -> Iterator[Notification]:
    """Yield notifications on ``channels`` until ``timeout_s`` passes without one."""
    names = [validate_name("channel", c, allow_reserved=True) for c in channels]
    validate_duration("timeout_s", timeout_s)
    by_channel = {channel_for(name): name for name in names}
    watcher = open_watcher(store, list(by_channel))
    return _listen(watcher, by_channel, timeout_s)


def _listen(
    watcher: Watcher, by_channel: dict[str, str], timeout_s: float
) -> Iterator[Notification]:
    try:
        while True:
            messages = watcher.receive(timeout_s)
            if not messages:
                return
            for channel, payload in messages:
                yield Notification(channel=by_channel.get(channel, channel), payload=payload)
    finally:
        watcher.close()


def open_watcher(
    store: Store,
    channels: list[str],
    listen_alias: str | None = None,
    *,
    queues: Sequence[str] = (),
) -> Watcher:
    """Return the engine's watcher for ``channels`` (already-mapped channel names).

    ``queues`` are the queue names behind the channels, for an engine that
    watches the job table itself rather than a channel (MariaDB/MySQL). The
    watcher connects through ``listen_alias``, by default ``conf.listen_alias``'s.
    """
    alias = listen_alias or app_settings.listen_alias(store.using)
    return store.dialect.open_watcher(channels, queues=queues, listen_alias=alias)


# A watcher that raised is closed and opened again this long after.
REOPEN_S = 1.0


class QueueWatch:
    """A worker's watch on its queues: wait, and pass on what arrived.

    ``wake`` is set whenever something may have arrived on ``queues``;
    ``controls`` too when one of them was paused or resumed, and ``cancels``
    when a job of one was asked to cancel (where the engine carries
    payloads); ``heard`` is called before each wake-up. A watcher that fails
    is closed and reopened ``REOPEN_S`` later; meanwhile the worker's poll
    finds the jobs and the requests, and once it is back the worker looks at
    once for what it missed.

    Each ``look`` is one wait: on PostgreSQL, whose watcher waits on its
    ``LISTEN`` socket (``Watcher.fileno``), inside the worker's main thread's
    own wait (``worker/wake.py``), which then hears a wake-up without a
    thread between; on the other engines in a watcher thread of its own
    (``watch_queues``).
    """

    def __init__(
        self,
        store: Store,
        queues: Sequence[Queue],
        wake: Event,
        controls: Event,
        cancels: Event | None = None,
        heard: Callable[[], None] | None = None,
        interrupt_fd: int | None = None,
    ) -> None:
        self.store = store
        self.channels = [q.channel for q in queues]
        self.queue_names = [q.name for q in queues]
        self.wake, self.controls, self.cancels, self.heard = wake, controls, cancels, heard
        self.interrupt_fd = interrupt_fd
        self.watcher: Watcher | None = None
        self.failed = False
        self.reopen_at = 0.0

    def fileno(self) -> int | None:
        """The socket a wake-up arrives on, to wait on with others; None while there is none."""
        return None if self.watcher is None else self.watcher.fileno()

    def look(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` and pass on what arrived; reopen a failed watcher when due."""
        try:
            if self.watcher is None:
                if time.monotonic() < self.reopen_at:
                    return
                self.watcher = open_watcher(self.store, self.channels, queues=self.queue_names)
                self.watcher.interrupt_fd = self.interrupt_fd
                if self.failed:
                    # What was sent while it was down is lost: the worker
                    # reads the controls and the cancels, and claims, at once.
                    self.failed = False
                    self.missed()
            woken, payloads = self.watcher.wait_for_payloads(timeout_s)
        except Exception:
            logger.warning("wake-up watcher failed; relying on polling", exc_info=True)
            self.close()
            self.failed = True
            self.reopen_at = time.monotonic() + REOPEN_S
            return
        if CONTROL_PAYLOAD in payloads:
            self.controls.set()
        if self.cancels is not None and any(p.startswith(CANCEL_PAYLOAD_PREFIX) for p in payloads):
            self.cancels.set()
        if woken:
            if self.heard is not None:
                self.heard()
            self.wake.set()

    def missed(self) -> None:
        """Have the worker look for what was sent while its watcher was down."""
        self.controls.set()
        if self.cancels is not None:
            self.cancels.set()
        self.wake.set()

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.close()
            self.watcher = None


def watch_queues(watch: QueueWatch, halt: Event) -> None:
    """Look with ``watch`` until ``halt`` is set: the body of a worker's watcher thread.

    A write to the watch's ``interrupt_fd`` (with ``halt`` set) ends a wait at once.
    """
    try:
        while not halt.is_set():
            watch.look(HALT_CHECK_S)
            if watch.watcher is None:
                halt.wait(max(watch.reopen_at - time.monotonic(), 0.0))
    finally:
        watch.close()
