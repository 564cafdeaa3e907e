"""Security: no pickle anywhere, no SQL text built from user strings.

The SQL check is dynamic: every statement the package sends while a hostile
name goes through enqueue, claim, ack, locks, schedules, notify and the
dead-letter moves is captured with ``connection.execute_wrapper``; the name
must reach the database only as a bound parameter, never inside the SQL text.
"""

from __future__ import annotations

import json
import re

import pytest
from django.db import connection

from alkstore_django import store
from alkstore_django.models import Job
from alkstore_django.scheduler import tick
from tests.helpers import ROOT, lapse_claim

PACKAGE = ROOT / "alkstore_django"
SENTINEL = "zq'\"sentinel; DROP TABLE x; --"


def test_no_pickle_or_eval_anywhere_in_the_package():
    offenders = []
    pattern = re.compile(r"\b(pickle|cPickle|marshal|shelve|dill|cloudpickle)\b|\beval\(|\bexec\(")
    for path in sorted(PACKAGE.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == []


@pytest.mark.django_db
def test_payloads_are_stored_as_json_text_not_as_python_objects():
    job_id = store.queue("plain").enqueue({"a": [1, "b"]})
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT payload FROM {Job._meta.db_table} WHERE id = %s", [job_id])
        raw = cursor.fetchone()[0]
    assert json.loads(raw) == {"a": [1, "b"]}


@pytest.mark.django_db(transaction=True)
def test_user_strings_reach_the_database_only_as_bound_parameters():
    statements: list[str] = []

    def capture(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        queue = store.queue(SENTINEL, max_attempts=2, retry_base_s=0)
        queue.enqueue_many([{"k": SENTINEL}, SENTINEL, 3])
        first = queue.claim_one(SENTINEL)
        assert first.heartbeat(30) and first.retry(error=SENTINEL, delay_s=0)
        second = queue.claim_one(SENTINEL)
        assert second.fail(SENTINEL)
        third = queue.claim_one(SENTINEL)
        lapse_claim(third.job.id)
        assert queue.claim_batch(SENTINEL, 5)  # reclaims the lapsed one
        queue.sweep_expired()
        queue.stats()
        held = store.try_lock(SENTINEL, ttl_s=5, owner=SENTINEL)
        assert held.renew() and held.release()
        store.schedule(SENTINEL, "@every 1s", SENTINEL, {"s": SENTINEL})
        tick(_default_store())
        store.notify(SENTINEL, SENTINEL)
        assert store.unschedule(SENTINEL)
    assert statements, "nothing was captured"
    leaks = [sql for sql in statements if "sentinel" in sql]
    assert leaks == []


def _default_store():
    from alkstore_django.store import get_store

    return get_store()
