"""The claim and the lapsed-claim sweep stay index scans behind a large backlog.

The SQL explained is the SQL the dialect really runs: it is captured from a
real ``claim_batch`` and explained with its parameters in place (and, for a
PostgreSQL prepared statement, also as the generic plan it settles on), with
and without planner statistics (ANALYZE). On MariaDB/MySQL the claim is the
``SELECT … ORDER BY … FOR UPDATE SKIP LOCKED`` that picks the rows.
"""

from __future__ import annotations

import contextlib
import re
from contextlib import contextmanager

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from alkstore_django import store
from alkstore_django.dialects.postgresql.prepared import numbered
from alkstore_django.models import DeadJob, Job
from tests.helpers import analyze_tables, fill_pending, lapse_claim, postgres_only

# ANALYZE TABLE commits implicitly on MariaDB/MySQL, so a rolled-back test
# would leave its backlog behind there: those tests flush the tables instead.
pytestmark = pytest.mark.django_db(transaction=connection.vendor == "mysql")

BACKLOG = 100_000
CLAIM_ORDER = re.compile(r"ORDER BY (j\.)?priority DESC")
# SQLite's planner is pinned with and without statistics. PostgreSQL is pinned
# after ANALYZE (autovacuum keeps statistics); with none at all it may pick
# alk_job_due and sort the target queue's handful of estimated rows, harmless
# when the backlog lives in another queue.
STATS = [True] if connection.vendor == "postgresql" else [True, False]


def capture_claim(backlog_queue, analyze):
    """Return (lapse sweep SQL, claim SQL) of one real claim on 'target'."""
    fill_pending(backlog_queue, BACKLOG)
    q = store.queue("target")
    q.enqueue_many(range(20))
    lapsed = q.claim_one("w")
    lapse_claim(lapsed.job.id)
    if analyze:
        analyze_tables()
    return claim_statements(q)


def claim_statements(q):
    """Run one real claim; return its (lapse sweep, claim) statements as (sql, params).

    Statements sent through Django's cursor arrive with their parameters
    inlined (params None); server-side prepared ones (PostgreSQL's hot path)
    are caught with their parameters (``caught_prepared``).
    """
    with caught_prepared() as prepared, CaptureQueriesContext(connection) as captured:
        assert len(q.claim_batch("w", 5)) == 5
    statements = [(c["sql"], None) for c in captured.captured_queries] + prepared
    lapse = [s for s in statements if "claim_expires_at <=" in s[0] and "'processing'" in s[0]]
    claim = [s for s in statements if "'pending'" in s[0] and CLAIM_ORDER.search(s[0])]
    assert lapse and claim, statements
    return lapse[0], claim[-1]


@contextmanager
def caught_prepared():
    """Collect the (sql, params) the dialect runs as prepared statements, while they run."""
    prepared = []
    dialect_class = type(store.dialect)
    with pytest.MonkeyPatch.context() as patch:
        for name in ("fetch_prepared", "fetch_generic"):
            original = getattr(dialect_class, name, None)
            if original is None:
                continue

            def spy(self, sql, params, _original=original, **kwargs):
                prepared.append((sql, list(params)))
                return _original(self, sql, params, **kwargs)

            patch.setattr(dialect_class, name, spy)
        yield prepared


def plans(statement):
    """Return the plans of a statement: on PostgreSQL custom and, if prepared, generic."""
    sql, params = statement
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("EXPLAIN QUERY PLAN " + sql)
            return ["\n".join(str(row[-1]) for row in cursor.fetchall())]
        if connection.vendor == "mysql":
            # One line per table: "table access-type key extra" ("ALL" is a full scan).
            cursor.execute("EXPLAIN " + sql)
            columns = [c[0] for c in cursor.description]
            rows = [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
            return ["\n".join(f"{r['table']} {r['type']} {r['key']} {r['Extra']}" for r in rows)]
        if params is None:
            cursor.execute("EXPLAIN " + sql)
            return ["\n".join(row[0] for row in cursor.fetchall())]
        found = []
        cursor.execute("EXPLAIN " + sql, params)
        found.append("\n".join(row[0] for row in cursor.fetchall()))
        # The plan a prepared statement settles on after five runs: no values known.
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute("PREPARE alk_plan_probe AS " + numbered(sql))
        marks = ", ".join(["%s"] * len(params))
        cursor.execute(f"EXPLAIN EXECUTE alk_plan_probe({marks})", params)
        found.append("\n".join(row[0] for row in cursor.fetchall()))
        cursor.execute("DEALLOCATE alk_plan_probe")
        return found


def assert_walks_claim_index(text):
    """The claim reads alk_job_claim in claim order: no sort of the backlog, no other index."""
    assert "alk_job_claim" in text, text
    assert "alk_job_due" not in text, text
    # SQLite: no temp b-tree; MariaDB/MySQL: no filesort. PostgreSQL's single
    # statement sorts only the few candidates (n fresh + the lapsed) above the
    # index scan, never the backlog.
    assert "TEMP B-TREE" not in text, text
    assert "filesort" not in text, text
    assert_no_full_scan(text)


def assert_no_full_scan(text):
    assert "Seq Scan on alkstore_django_job" not in text, text
    assert "alkstore_django_job ALL " not in text, text
    assert not any(
        line.strip().startswith("SCAN alkstore_django_job") for line in text.splitlines()
    ), text


@pytest.mark.parametrize("analyze", STATS, ids=["analyzed", "no-stats"][: len(STATS)])
def test_claim__uses_the_claim_index_with_100k_pending_in_another_queue(analyze):
    _, claim = capture_claim("backlog", analyze)
    for text in plans(claim):
        assert_walks_claim_index(text)


@pytest.mark.parametrize("analyze", [True, False], ids=["analyzed", "no-stats"])
def test_claim__walks_the_claim_index_in_order_with_100k_ready_in_its_own_queue(analyze):
    _, claim = capture_claim("target", analyze)
    for text in plans(claim):
        assert_walks_claim_index(text)


@pytest.mark.parametrize("analyze", [True, False], ids=["analyzed", "no-stats"])
def test_lapsed_sweep__uses_the_lapse_index_with_100k_pending_in_another_queue(analyze):
    lapse, _ = capture_claim("backlog", analyze)
    for text in plans(lapse):
        assert "alk_job_lapse" in text, text
        assert_no_full_scan(text)


@postgres_only("SQLite and MariaDB claim in several statements, each planned on its own")
def test_claim__writes_only_its_acks_and_its_claims_until_it_saw_a_lapsed_claim():
    # The moves of lapsed claims (to the dead letters, back to pending) were
    # three more writes in every claim statement: the server set them up at
    # each claim (about 25 of a batch-1 claim's 450 µs) with nothing to move
    # almost always. A claim that sees a lapsed claim moves it right after.
    q = store.queue("target")
    q.enqueue_many(range(8))
    _, claim = claim_statements(q)
    writes = re.compile(r"^\s*(->\s*)?(Delete|Update|Insert) on ", re.MULTILINE)
    for text in plans(claim):
        assert [m.group(2) for m in writes.finditer(text)] == ["Delete", "Update"], text
    exhausted, spare, _ = q.claim_batch("w", 3)
    Job.objects.filter(id=exhausted.job.id).update(max_attempts=1)
    for held in (exhausted, spare):
        lapse_claim(held.job.id)
    # A claim of nothing (as a limited queue's, held back) still moves them.
    assert store.dialect.claim_and_ack("target", "w", 0, "w", []) == ([], [])
    assert not Job.objects.filter(id=exhausted.job.id).exists()
    assert DeadJob.objects.get(id=exhausted.job.id).last_error == "max attempts exceeded"
    assert Job.objects.filter(id=spare.job.id, state="pending", worker_id=None).exists()


def test_claim__keeps_the_claim_index_when_its_queue_grew_after_analyze():
    q = store.queue("target")
    q.enqueue_many(range(20))
    analyze_tables()
    fill_pending("target", BACKLOG)
    _, claim = claim_statements(q)
    for text in plans(claim):
        assert_walks_claim_index(text)


def test_next_due_at__reads_only_the_scheduled_rows_behind_100k_ready_in_its_queue():
    # An idle worker asks this after every empty claim: it must not walk the
    # queue's ready rows, which alk_job_due leaves out (run_at = enqueued_at).
    fill_pending("target", BACKLOG)
    store.queue("target").enqueue("later", delay_s=60)
    analyze_tables()
    with CaptureQueriesContext(connection) as captured:
        due = store.dialect.next_due_at(["target"])
    assert due is not None and 50 < due <= 60
    [text] = plans((captured.captured_queries[-1]["sql"], None))
    assert "alk_job_due" in text, text
    assert_no_full_scan(text)


def test_fenced_acks__find_their_rows_by_primary_key_behind_many_claims_in_flight():
    # Statistics taken while everything was pending make alk_job_lapse look
    # empty; read through it, an ack of a few jobs walked every claim in
    # flight and every index entry left since the last vacuum, so each claim
    # cost more with every job run (a third of its round trip after 20,000).
    fill_pending("target", 5_000)
    analyze_tables()
    q = store.queue("target")
    held = []
    for _ in range(10):
        held += q.claim_batch("w", 100)
    fences = [(h.job.id, h.job.generation) for h in held[:32]]
    with caught_prepared() as prepared, CaptureQueriesContext(connection) as captured:
        acked, _, _ = q.ack_and_claim("w", 32, fences)
    assert sorted(acked) == sorted(f[0] for f in fences)
    statements = [(c["sql"], None) for c in captured.captured_queries] + prepared
    acks = [s for s in statements if "DELETE" in s[0] and "generation" in s[0]]
    assert acks, statements
    for text in plans(acks[0]):
        if "CTE acked" in text:  # PostgreSQL: the acks ride the claim statement
            text = text[text.index("CTE acked") : text.index("CTE lapsed")]
        assert "alk_job_lapse" not in text, text
        assert_no_full_scan(text)


def unpooled(reason: str) -> pytest.MarkDecorator:
    """Skip behind a transaction-mode pooler (``DISABLE_SERVER_SIDE_CURSORS``), where ``reason``."""
    return pytest.mark.skipif(
        bool(connection.settings_dict.get("DISABLE_SERVER_SIDE_CURSORS")),
        reason=f"behind a transaction-mode pooler {reason}",
    )


@postgres_only(
    "SQLite plans each statement as it prepares it, and MariaDB/MySQL's client binds "
    "values client-side: neither keeps a plan across calls to re-make"
)
@unpooled("nothing is prepared: each claim is planned afresh")
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("own_session", "bound_server_side"),
    [(False, False), (True, False), (True, True)],
    ids=["claim_batch", "worker", "worker_server_side_binding"],
)
def test_worker_claim__runs_its_generic_plan_from_the_first_cycle_with_a_backlog_analyzed(
    own_session, bound_server_side, monkeypatch
):
    # Statistics showing a backlog (what autovacuum's ANALYZE leaves) made
    # PostgreSQL judge the generic plan dearer than a custom one and plan the
    # claim afresh on every cycle: 0 generic plans and 1 custom plan a call.
    # A worker's main thread sets its session to generic plans
    # (``own_session``); any other caller's claim sets it for itself, as does
    # a worker on a site whose every query is prepared (server-side binding).
    if bound_server_side:
        options = dict(store.dialect.connection.settings_dict["OPTIONS"], server_side_binding=True)
        monkeypatch.setitem(store.dialect.connection.settings_dict, "OPTIONS", options)
    if own_session:
        store.dialect.own_session()
    try:
        claim_twelve_times_behind_a_backlog()
        with store.dialect.connection.cursor() as cursor:
            cursor.execute("SHOW plan_cache_mode")
            mode = cursor.fetchone()[0]
    finally:
        store.dialect.own_session(False)
        store.dialect.connection.close()  # the session's mode goes with it
    assert mode == ("force_generic_plan" if own_session and not bound_server_side else "auto")


@postgres_only("only PostgreSQL's worker sets its session's plan mode (``own_session``)")
@unpooled("the worker's session is not set")
@pytest.mark.django_db(transaction=True)
def test_worker_session__given_back__has_the_servers_plan_mode_again():
    # The connection may live on after the worker (Django's pool, the thread's
    # own next statements): it must not keep forcing generic plans.
    q = store.queue("target")
    q.enqueue("x")

    def mode() -> str:
        with store.dialect.connection.cursor() as cursor:
            cursor.execute("SHOW plan_cache_mode")
            return cursor.fetchone()[0]

    servers = mode()
    store.dialect.own_session()
    try:
        _, handles, _ = q.ack_and_claim("w", 1, [])
        assert len(handles) == 1
        assert mode() == "force_generic_plan"
    finally:
        store.dialect.own_session(False)
    try:
        assert mode() == servers
    finally:
        store.dialect.connection.close()


def claim_twelve_times_behind_a_backlog():
    fill_pending("backlog", BACKLOG)
    q = store.queue("target")
    q.enqueue_many(range(200))
    analyze_tables()
    fences = []
    for _ in range(12):
        # The worker's cycle, in autocommit as the worker runs it.
        acked, handles, _ = q.ack_and_claim("w", 8, fences)
        assert sorted(acked) == sorted(f[0] for f in fences)
        fences = [(h.job.id, h.job.generation) for h in handles]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
            "WHERE statement LIKE %s",
            ["%FOR UPDATE SKIP LOCKED%"],
        )
        counts = cursor.fetchall()
    assert counts == [(12, 0)], counts


@pytest.mark.parametrize("n", [32, 100])
def test_fenced_acks__look_generations_up_without_a_join_at_any_batch(n):
    # A join on unnest(ids, generations) was a nested loop that re-read the
    # function's rows for every row acked: its cost grew with the square of the batch.
    q = store.queue("target")
    q.enqueue_many(range(n))
    fences = [(h.job.id, h.job.generation) for h in q.claim_batch("w", n)]
    with caught_prepared() as prepared, CaptureQueriesContext(connection) as captured:
        acked, _, _ = q.ack_and_claim("w", 1, fences)
    assert sorted(acked) == sorted(f[0] for f in fences)
    statements = [(c["sql"], None) for c in captured.captured_queries] + prepared
    [ack] = [s for s in statements if "DELETE" in s[0] and "generation" in s[0]][:1]
    for text in plans(ack):
        if "CTE acked" in text:
            text = text[text.index("CTE acked") : text.index("CTE lapsed")]
        assert "Function Scan" not in text, text
        assert "Nested Loop" not in text, text


@postgres_only("the named claim statement and psycopg's deallocation are PostgreSQL's")
@unpooled("nothing is prepared by name")
@pytest.mark.django_db(transaction=True)
def test_worker_claim__is_prepared_again_after_a_rollback_deallocated_it():
    # psycopg runs DEALLOCATE ALL after a rollback on a connection where it
    # prepared statements of its own (enqueue's): the claim's named statement goes too.
    q = store.queue("target")
    q.enqueue_many(range(4))
    assert len(q.ack_and_claim("w", 2, [])[1]) == 2
    with contextlib.suppress(RuntimeError), transaction.atomic():
        q.enqueue("rolled back")
        raise RuntimeError
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'alk_%%'")
        assert cursor.fetchone() == (0,)
    assert len(q.ack_and_claim("w", 2, [])[1]) == 2
