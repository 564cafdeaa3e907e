"""PostgreSQL's prepared statements: by psycopg for most, by name on a generic plan for the claim.

The hot statements (enqueue, the worker's claim) run as server-side prepared
statements unless the alias sets ``DISABLE_SERVER_SIDE_CURSORS``, which is
what Django asks of a site behind a transaction-mode pooler: there a named
statement would not follow the next transaction to its server connection.
"""

from __future__ import annotations

import contextlib
import re
import threading
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..base import Dialect
from ..driver import ensure_open

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

# psycopg prepares a statement after this many runs: never, for the site's own.
NEVER_AUTO_PREPARE = 2**62

# The claim runs on its generic plan, made once per connection: with statistics
# showing rows in the job table (what autovacuum's ANALYZE leaves behind a
# backlog), PostgreSQL judged the generic plan dearer than a custom one (a
# parameter LIMIT is costed as a tenth of the table) and planned the statement
# afresh on every call, 0.6-1.6 ms a cycle. SET LOCAL scopes the mode to the
# claim's own transaction. tests/schema/test_query_plans.py pins the plan.
GENERIC_PLAN = "SET LOCAL plan_cache_mode = force_generic_plan; "
# The same for a worker's own session (``own_session``).
SESSION_GENERIC_PLANS = "SET plan_cache_mode = force_generic_plan"
RESET_PLANS = "RESET plan_cache_mode"


def numbered(sql: str) -> str:
    """Return ``sql`` with its ``%s`` marks as ``$1``, ``$2``…, as ``PREPARE`` takes it."""
    marks = iter(range(1, sql.count("%s") + 1))
    return re.sub(r"%s", lambda _: f"${next(marks)}", sql).replace("%%", "%")


def honour_prepare(raw: Any) -> None:
    """Let ``prepare=True`` prepare on the psycopg connection ``raw``.

    Django turns psycopg's preparation off (threshold None), which also
    ignores prepare=True. A threshold no query count reaches keeps automatic
    preparation off for the site's own queries while honouring ours.
    """
    if raw.prepare_threshold is None:
        raw.prepare_threshold = NEVER_AUTO_PREPARE


def _prepared_cursor(raw: Any, prepare: bool) -> Any:
    """Return a new cursor on the psycopg connection ``raw``, which honours ``prepare=True``.

    Once per connection is enough for the threshold: a kept cursor is made
    again for each new connection.
    """
    # Imported here, not at the top: nothing may import psycopg on a SQLite site,
    # where it need not be installed (it is the optional extra "postgres").
    import psycopg

    if prepare:
        honour_prepare(raw)
    return psycopg.Cursor(raw)


class PreparedStatements(Dialect):
    """The dialect's two ways to run a statement prepared, each with its cursors kept per thread."""

    def __init__(self, using: str) -> None:
        super().__init__(using)
        self._cursors = threading.local()

    def fetch_prepared(
        self,
        sql: str,
        params: Sequence[Any],
        *,
        keep_cursor: bool = False,
        wrapper: BaseDatabaseWrapper | None = None,
    ) -> list[tuple[Any, ...]]:
        """Run ``sql`` as a server-side prepared statement and return its rows.

        For the worker's own statements and ``enqueue()``, run many times a
        second: Django's cursor binds parameters client-side, so the server
        would parse and plan every call. The connection (and its transaction
        state, its adapters) is still Django's; errors are Django's. A site
        behind a transaction-mode pooler sets ``DISABLE_SERVER_SIDE_CURSORS``
        (as Django advises); then the statement is bound server-side but not
        prepared, since a named statement would not follow the next
        transaction.

        ``keep_cursor`` reuses one cursor per thread and connection: a fresh
        cursor costs more than the Python of a whole ``enqueue()`` (its result
        loaders are looked up again). A kept cursor holds its last result until
        the next call, so it is only for statements that return a few small
        rows; a claim's rows carry payloads and get a cursor of their own.
        ``wrapper`` is the alias's connection when the caller has looked it
        up already (a lookup is a thread-local read through asgiref's
        ``Local``: a few µs of an enqueue).
        """
        if wrapper is None:
            wrapper = self.connection
        ensure_open(wrapper)
        # As Django's cursor does: inside an atomic block marked for rollback, no query.
        wrapper.validate_no_broken_transaction()
        raw = wrapper.connection
        prepare = not wrapper.settings_dict.get("DISABLE_SERVER_SIDE_CURSORS")
        if keep_cursor:
            cursor = getattr(self._cursors, "cursor", None)
            if cursor is None or cursor.connection is not raw:
                # Django's reconnect makes a new connection object.
                cursor = self._cursors.cursor = _prepared_cursor(raw, prepare)
        else:
            cursor = _prepared_cursor(raw, prepare)
        with wrapper.wrap_database_errors:
            try:
                cursor.execute(sql, params, prepare=prepare)
                return cursor.fetchall()
            finally:
                if not keep_cursor:
                    cursor.close()

    def fetch_generic(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        """Run ``sql`` on the generic plan of a statement prepared once per connection.

        For the claim, whose custom plans cost more to make than to run
        (``GENERIC_PLAN``). The statement is prepared by name on each
        connection and run as ``EXECUTE`` with its values quoted client-side,
        in one simple query after the ``SET LOCAL`` that forces its generic
        plan: one implicit transaction, so the mode ends with the claim.
        psycopg deallocates every prepared statement after a rollback on the
        connection; the claim then fails before it has done anything and is
        prepared again. Inside a caller's transaction (where a failure would
        abort it) and behind a transaction-mode pooler (where nothing can be
        prepared by name) it runs through ``fetch_prepared``, planned as
        PostgreSQL chooses.
        """
        import psycopg

        wrapper = self.connection
        ensure_open(wrapper)
        raw = wrapper.connection
        # libpq's own status, not ``raw.info``'s: that builds an object and an
        # enum member on every claim.
        if (
            wrapper.settings_dict.get("DISABLE_SERVER_SIDE_CURSORS")
            or raw.pgconn.transaction_status != psycopg.pq.TransactionStatus.IDLE
        ):
            return self.fetch_prepared(sql, params, wrapper=wrapper)
        if getattr(self._cursors, "own_session", False) and not wrapper.settings_dict[
            "OPTIONS"
        ].get("server_side_binding"):
            return self._fetch_on_own_session(sql, params, wrapper)
        kept = getattr(self._cursors, "generic", None)
        if kept is None or kept[0].connection is not raw:
            # Django's reconnect makes a new connection, which has prepared nothing.
            kept = self._cursors.generic = (self._generic_cursor(raw), set[str]())
        cursor, prepared = kept
        name = f"alk_generic_{zlib.crc32(sql.encode()):08x}"
        run = f"{GENERIC_PLAN}EXECUTE {name}({', '.join(['%s'] * len(params))})"
        with wrapper.wrap_database_errors:
            if name not in prepared:
                cursor.execute(f"PREPARE {name} AS {numbered(sql)}")
                prepared.add(name)
            try:
                cursor.execute(run, params)
            except psycopg.errors.InvalidSqlStatementName:
                cursor.execute(f"PREPARE {name} AS {numbered(sql)}")
                cursor.execute(run, params)
            cursor.nextset()
            return cursor.fetchall()

    def own_session(self, owned: bool = True) -> None:
        """Run this thread's claims on its connection's session set to generic plans.

        For a worker's main thread, whose connection carries only the
        worker's own statements: the claim is then prepared by psycopg and
        bound server-side, where the named statement's ``EXECUTE`` after a
        ``SET LOCAL`` in one simple query costs another statement and the
        quoting of every value (a tenth of a millisecond a claim here). The
        session's mode changes the plans of prepared statements only, and the
        site's own queries are not prepared: unless they are bound
        server-side (``OPTIONS["server_side_binding"]``), where every query is
        an unnamed prepared statement; then the claim stays on
        ``fetch_generic``'s ``SET LOCAL``. The other statements that thread
        prepares (the enqueue of a workflow's next step) get generic plans
        too: single-row writes by key, whose generic plan is their custom one.
        ``own_session(False)`` resets the session's mode.
        """
        self._cursors.own_session = owned
        if owned:
            return
        cursor, self._cursors.session = getattr(self._cursors, "session", None), None
        # Only on this thread's own connection still: one given back to a pool
        # may be another thread's by now.
        if cursor is not None and cursor.connection is self.connection.connection:
            import psycopg

            # The connection may live on (Django's pool, this thread's next
            # statements): its session's mode goes back to the server's.
            if not cursor.connection.closed:
                with contextlib.suppress(psycopg.Error):
                    cursor.execute(RESET_PLANS)

    def _fetch_on_own_session(
        self, sql: str, params: Sequence[Any], wrapper: BaseDatabaseWrapper
    ) -> list[tuple[Any, ...]]:
        import psycopg

        raw = wrapper.connection
        cursor = getattr(self._cursors, "session", None)
        with wrapper.wrap_database_errors:
            if cursor is None or cursor.connection is not raw:
                # Django's reconnect makes a new connection, whose session is new.
                honour_prepare(raw)
                cursor = self._generic_cursor(raw, psycopg.Cursor)
                cursor.execute(SESSION_GENERIC_PLANS)
                self._cursors.session = cursor
            cursor.execute(sql, params, prepare=True)
            return cursor.fetchall()

    @staticmethod
    def _generic_cursor(raw: Any, kind: Any = None) -> Any:
        """Return a cursor ``fetch_generic`` keeps for the connection ``raw`` (a ``kind``).

        Its timestamps are read by psycopg's own loader (C, in psycopg's
        binary build). Django's wraps that loader to put the connection's time
        zone on each value, which the session's zone already is (Django sets
        it, and the checks refuse ``USE_TZ = False``): a third of the cost of
        decoding a claimed row, for the same instants.
        """
        import psycopg
        from psycopg.types.datetime import TimestamptzLoader

        cursor = (kind or psycopg.ClientCursor)(raw)
        cursor.adapters.register_loader("timestamptz", TimestamptzLoader)
        return cursor
