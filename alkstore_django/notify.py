"""Wake-ups: ``NOTIFY``/``LISTEN`` on PostgreSQL, a watch on the database file on SQLite.

Queue wake-ups ride the same substrate as ``store.notify``: a queue's channel
is ``channel_for(queue)``, sent by the enqueue statement itself.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from django.db import connections

from .conf import DEFAULT_SQLITE_WATCH_INTERVAL_S, app_settings
from .errors import InvalidArgument
from .queues import channel_for
from .records import Notification
from .validation import is_encodable, validate_duration, validate_name

if TYPE_CHECKING:
    from .store import Store

logger = logging.getLogger(__name__)

# PostgreSQL refuses NOTIFY payloads of 8,000 bytes or more.
MAX_NOTIFY_PAYLOAD_BYTES = 7999


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
    watcher = open_watcher(store, list(by_channel), app_settings.listen_database)
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


def open_watcher(store: Store, channels: list[str], listen_alias: str | None = None) -> Watcher:
    """Return the vendor's watcher for ``channels`` (already-mapped channel names)."""
    if store.dialect.vendor == "postgresql":
        return PostgresWatcher(listen_alias or store.using, channels)
    return SqliteWatcher(store.using, channels)


class Watcher:
    """Waits for wake-ups on a set of channels over its own dedicated connection."""

    def receive(self, timeout_s: float) -> list[tuple[str, str]]:
        """Return the (channel, payload) pairs that arrived within ``timeout_s``."""
        raise NotImplementedError

    def wait(self, timeout_s: float) -> bool:
        """Return True as soon as something may have changed, False on timeout."""
        return bool(self.receive(timeout_s))

    def close(self) -> None:
        raise NotImplementedError


class PostgresWatcher(Watcher):
    """One LISTEN connection for all channels; it reconnects after a drop.

    It connects through ``LISTEN_DATABASE`` when set, so a transaction-mode
    pooler (which cannot hold a LISTEN) can serve everything else.
    """

    def __init__(self, alias: str, channels: list[str]) -> None:
        self.alias = alias
        self.channels = channels
        self._conn: Any = None
        self.reconnects = 0
        # LISTEN at once: a notification sent between opening the watcher and
        # the first receive() must not be lost. A failure here is retried there.
        import psycopg

        try:
            self._conn = self._connect()
        except psycopg.Error as exc:
            logger.warning("listener connection failed alias=%s error=%s", alias, exc)

    def _connect(self) -> Any:
        from psycopg import sql

        wrapper = connections[self.alias]
        conn = wrapper.get_new_connection(wrapper.get_connection_params())
        conn.autocommit = True
        for channel in self.channels:
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        return conn

    def receive(self, timeout_s: float) -> list[tuple[str, str]]:
        import psycopg

        deadline = time.monotonic() + timeout_s
        try:
            if self._conn is None or self._conn.closed:
                if self._conn is not None:
                    self.reconnects += 1
                self._conn = self._connect()
                if self.reconnects:
                    logger.info("listener reconnected alias=%s", self.alias)
                    # Anything sent while we were away is lost: report a wake-up
                    # so the caller polls at once.
                    return [("", "")]
            messages = []
            for note in self._conn.notifies(timeout=max(timeout_s, 0.0), stop_after=1):
                messages.append((note.channel, note.payload))
            # Drain whatever else already arrived without waiting again.
            if messages:
                for note in self._conn.notifies(timeout=0, stop_after=1000):
                    messages.append((note.channel, note.payload))
            return messages
        except psycopg.Error as exc:
            logger.warning("listener connection lost alias=%s error=%s", self.alias, exc)
            self._drop()
            # Back off briefly instead of spinning on a dead server.
            time.sleep(min(0.5, max(deadline - time.monotonic(), 0.0)))
            return []

    def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class SqliteWatcher(Watcher):
    """Watches ``PRAGMA data_version``: it changes whenever another connection commits."""

    def __init__(self, alias: str, channels: list[str]) -> None:
        from .models import ChannelMessage

        self.table = ChannelMessage._meta.db_table
        self.channels = channels
        name = str(connections[alias].settings_dict["NAME"])
        self._conn = sqlite3.connect(name, uri=name.startswith("file:"), check_same_thread=False)
        self._conn.isolation_level = None
        self._version = self._data_version()
        self._last_id = self._max_id()

    def _data_version(self) -> int:
        return self._conn.execute("PRAGMA data_version").fetchone()[0]

    def _max_id(self) -> int:
        try:
            row = self._conn.execute(f"SELECT max(id) FROM {self.table}").fetchone()
        except sqlite3.OperationalError:
            return 0
        return row[0] or 0

    def wait(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            version = self._data_version()
            if version != self._version:
                self._version = version
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(DEFAULT_SQLITE_WATCH_INTERVAL_S, remaining))

    def receive(self, timeout_s: float) -> list[tuple[str, str]]:
        deadline = time.monotonic() + timeout_s
        while True:
            marks = ", ".join("?" * len(self.channels))
            rows = self._conn.execute(
                f"SELECT id, channel, payload FROM {self.table} "
                f"WHERE id > ? AND channel IN ({marks}) ORDER BY id",
                [self._last_id, *self.channels],
            ).fetchall()
            if rows:
                self._last_id = rows[-1][0]
                return [(row[1], row[2]) for row in rows]
            if not self.wait(max(deadline - time.monotonic(), 0.0)):
                return []

    def close(self) -> None:
        self._conn.close()
