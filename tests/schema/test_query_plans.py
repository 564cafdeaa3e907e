"""The claim and the lapsed-claim sweep stay index scans behind a large backlog.

The SQL explained is the SQL the dialect really runs: it is captured from a
real ``claim_batch`` and explained with its parameters in place, with and
without planner statistics (ANALYZE).
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from alkstore_django import store
from tests.helpers import fill_pending, lapse_claim

pytestmark = pytest.mark.django_db

BACKLOG = 100_000
# SQLite's planner is pinned with and without statistics. PostgreSQL is pinned
# after ANALYZE (autovacuum keeps statistics); with none at all it may pick
# alk_job_due and sort the target queue's handful of estimated rows, harmless
# when the backlog lives in another queue.
STATS = [True, False] if connection.vendor == "sqlite" else [True]


def capture_claim(backlog_queue, analyze):
    """Return (lapse sweep SQL, claim SQL) of one real claim on 'target'."""
    fill_pending(backlog_queue, BACKLOG)
    q = store.queue("target")
    q.enqueue_many(range(20))
    lapsed = q.claim_one("w")
    lapse_claim(lapsed.job.id)
    if analyze:
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
    with CaptureQueriesContext(connection) as captured:
        assert len(q.claim_batch("w", 5)) == 5
    statements = [s["sql"] for s in captured.captured_queries]
    lapse = [s for s in statements if "claim_expires_at <=" in s and "'processing'" in s]
    claim = [s for s in statements if "'pending'" in s and "ORDER BY priority DESC" in s]
    assert lapse and claim, statements
    return lapse[0], claim[-1]


def plan(sql):
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("EXPLAIN " + sql)
            return "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("EXPLAIN QUERY PLAN " + sql)
        return "\n".join(str(row[-1]) for row in cursor.fetchall())


def assert_no_full_scan(text):
    assert "Seq Scan on alkstore_django_job" not in text, text
    assert not any(
        line.strip().startswith("SCAN alkstore_django_job") for line in text.splitlines()
    ), text


@pytest.mark.parametrize("analyze", STATS, ids=["analyzed", "no-stats"][: len(STATS)])
def test_claim__uses_the_claim_index_with_100k_pending_in_another_queue(analyze):
    _, claim = capture_claim("backlog", analyze)
    text = plan(claim)
    assert "alk_job_claim" in text, text
    assert "TEMP B-TREE" not in text and "Sort" not in text, text
    assert_no_full_scan(text)


@pytest.mark.parametrize("analyze", [True, False], ids=["analyzed", "no-stats"])
def test_claim__walks_the_claim_index_in_order_with_100k_ready_in_its_own_queue(analyze):
    _, claim = capture_claim("target", analyze)
    text = plan(claim)
    assert "alk_job_claim" in text, text
    assert "TEMP B-TREE" not in text and "Sort" not in text, text
    assert_no_full_scan(text)


@pytest.mark.parametrize("analyze", [True, False], ids=["analyzed", "no-stats"])
def test_lapsed_sweep__uses_the_lapse_index_with_100k_pending_in_another_queue(analyze):
    lapse, _ = capture_claim("backlog", analyze)
    text = plan(lapse)
    assert "alk_job_lapse" in text, text
    assert_no_full_scan(text)


def test_claim__keeps_the_claim_index_when_its_queue_grew_after_analyze():
    q = store.queue("target")
    q.enqueue_many(range(20))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    fill_pending("target", BACKLOG)
    with CaptureQueriesContext(connection) as captured:
        assert len(q.claim_batch("w", 5)) == 5
    claim = [s["sql"] for s in captured.captured_queries if "ORDER BY priority DESC" in s["sql"]]
    text = plan(claim[-1])
    assert "alk_job_claim" in text, text
    assert "TEMP B-TREE" not in text and "Sort" not in text, text
