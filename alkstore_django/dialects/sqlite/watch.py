"""SQLite wake-ups: there is no NOTIFY, so the watcher watches the file.

``PRAGMA data_version`` changes whenever another connection commits; the
messages ``notify`` wrote are read from the message table on its own
connection.
"""

from __future__ import annotations

import sqlite3
import time

from django.db import connections

from ...conf import DEFAULT_SQLITE_WATCH_INTERVAL_S
from ..base import MESSAGE_TABLE, Watcher


class SqliteWatcher(Watcher):
    """Watches ``PRAGMA data_version``: it changes whenever another connection commits."""

    def __init__(self, alias: str, channels: list[str]) -> None:
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
            row = self._conn.execute(f"SELECT max(id) FROM {MESSAGE_TABLE}").fetchone()
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
            if not self.pause(min(DEFAULT_SQLITE_WATCH_INTERVAL_S, remaining)):
                return False

    def receive(self, timeout_s: float) -> list[tuple[str, str]]:
        deadline = time.monotonic() + timeout_s
        while True:
            marks = ", ".join("?" * len(self.channels))
            rows = self._conn.execute(
                f"SELECT id, channel, payload FROM {MESSAGE_TABLE} "
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
