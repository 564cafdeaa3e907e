"""PostgreSQL wake-ups: one ``LISTEN`` session per watcher, ``NOTIFY`` delivered on commit."""

from __future__ import annotations

import contextlib
import logging
import selectors
import time
from typing import Any

from django.db import connections

from ..base import Watcher

logger = logging.getLogger("alkstore_django.dialects.postgresql")


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
        # The connection's text encoding, and whether psycopg may hold
        # notifications of its own (``_pending``): both set by ``_connect``.
        self._encoding = "utf-8"
        self._backlog = False
        # LISTEN at once: a notification sent between opening the watcher and
        # the first receive() must not be lost. A failure here is retried there.
        import psycopg  # here, not at the top: a SQLite site need not have it

        try:
            self._conn = self._connect()
        except psycopg.Error as exc:
            logger.warning("listener connection failed alias=%s error=%s", alias, exc)

    def _connect(self) -> Any:
        from psycopg import sql as pgsql

        wrapper = connections[self.alias]
        conn = wrapper.get_new_connection(wrapper.get_connection_params())
        conn.autocommit = True
        for channel in self.channels:
            conn.execute(pgsql.SQL("LISTEN {}").format(pgsql.Identifier(channel)))
        self._encoding = conn.info.encoding
        self._backlog = True
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
            # psycopg's timed wait costs most of a millisecond of CPU per call
            # whatever the timeout; waiting on the socket costs microseconds,
            # so the worker's watcher can look at its halt flag often.
            # notifies(timeout=0) reads what already arrived (and what psycopg
            # kept from earlier statements) without waiting.
            messages = self._pending()
            if messages:
                return messages
            with selectors.DefaultSelector() as selector:
                selector.register(self._conn.fileno(), selectors.EVENT_READ)
                if self.interrupt_fd is not None:
                    selector.register(self.interrupt_fd, selectors.EVENT_READ)
                while not messages:
                    remaining = deadline - time.monotonic()
                    ready = selector.select(remaining) if remaining > 0 else []
                    if not ready or any(key.fd == self.interrupt_fd for key, _ in ready):
                        break
                    messages = self._pending()
            return messages
        except psycopg.Error as exc:
            logger.warning("listener connection lost alias=%s error=%s", self.alias, exc)
            self._drop()
            # Back off briefly instead of spinning on a dead server.
            time.sleep(min(0.5, max(deadline - time.monotonic(), 0.0)))
            return []

    def fileno(self) -> int | None:
        conn = self._conn
        return None if conn is None or conn.closed else conn.fileno()

    def wait_for_payloads(self, timeout_s: float) -> tuple[bool, list[str]]:
        messages = self.receive(timeout_s)
        return bool(messages), [payload for _, payload in messages]

    def _pending(self) -> list[tuple[str, str]]:
        """Read what already arrived, without waiting.

        Notifications that came in while a ``LISTEN`` ran wait in psycopg's
        backlog: the first read after a connect goes through ``notifies()``,
        which hands them over. After that nothing but this method reads the
        connection, so it asks libpq directly: ``notifies(timeout=0)`` goes
        through psycopg's generic wait even when something is there, three
        times the CPU (about 55 against 18 µs here), on every pickup's path.
        A connection that failed raises ``OperationalError`` from
        ``consume_input``, as from the wait.
        """
        conn = self._conn
        if self._backlog:
            self._backlog = False
            return [(n.channel, n.payload) for n in conn.notifies(timeout=0, stop_after=1000)]
        pgconn, encoding = conn.pgconn, self._encoding
        pgconn.consume_input()
        found = []
        while (note := pgconn.notifies()) is not None:
            found.append((note.relname.decode(encoding), note.extra.decode(encoding)))
        return found

    def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
