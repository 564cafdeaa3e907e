"""PgBouncer in transaction mode: no prepared statement leaks across pooled transactions.

These run when the suite is pointed at a pooler (``DIRECT_DATABASE_URL`` set,
as in ``scripts/test.sh``'s pgbouncer run, where ``default`` goes through
PgBouncer with ``DISABLE_SERVER_SIDE_CURSORS`` and ``direct`` goes straight
to PostgreSQL). A named prepared statement lives on one server connection;
behind a transaction-mode pooler the next transaction may run on another,
so the PostgreSQL dialect must prepare nothing there.
"""

from __future__ import annotations

import pytest
from django.db import connections

from alkstore_django import store
from alkstore_django.dialects import dialect_for
from alkstore_django.notify import open_watcher
from tests.concurrency.starting_line import run_threads
from tests.helpers import pooled_only, waiting_worker

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=["default", "direct"]),
    pooled_only("needs the direct alias past the pooler (scripts/test.sh pgbouncer)"),
]

SESSIONS = 10  # PgBouncer's default_pool_size in scripts/test.sh
PROBE = "SELECT (SELECT count(*) FROM pg_prepared_statements), pg_backend_pid(), pg_sleep(0.3)"


def prepared_per_server_connection(alias):
    """Return {server pid: prepared statements}, probing every pooled server connection.

    Each probe holds its transaction for 0.3 s, so the pooler hands the
    concurrent probes distinct server connections: all of the pool's.
    """

    def probe(_):
        with connections[alias].cursor() as cursor:
            cursor.execute(PROBE)
            count, pid, _ = cursor.fetchone()
            return pid, count

    return dict(run_threads(SESSIONS, probe))


def test_hot_paths__leave_no_prepared_statement_on_any_pooled_server_connection():
    def work(index):
        q = store.queue(f"pooled-{index % 2}")
        q.enqueue({"n": index})
        q.enqueue_many([{"n": index}, {"n": -index}])
        for handle in q.claim_batch(f"w{index}", 2):
            assert handle.ack() is True
        _, handles, _ = q.ack_and_claim(f"w{index}", 5)
        return len(handles)

    # More client connections than server connections: their transactions
    # interleave on the pool's server connections.
    run_threads(SESSIONS * 2, work)
    found = prepared_per_server_connection("default")
    assert len(found) >= 2, found
    assert set(found.values()) == {0}, found


def test_a_direct_connection__does_prepare_so_the_probe_above_can_see_a_leak():
    dialect = dialect_for("direct")
    dialect.enqueue(store.queue("direct")._plain, ['{"n": 1}'])
    with connections["direct"].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements")
        assert cursor.fetchone()[0] >= 1


def test_wakeups__listen_past_the_pooler_and_arrive_on_commit():
    assert store.dialect.supports_listen_notify
    watcher = open_watcher(store, [store.queue("pooled-wake").channel], queues=["pooled-wake"])
    try:
        assert watcher.alias == "direct"
        with waiting_worker("pooled-wake"):  # producers wake only a waiting worker
            store.queue("pooled-wake").enqueue({})
        assert watcher.wait(5.0) is True
    finally:
        watcher.close()
